"""Device memory and batches: how many tokens a batch may hold, and what running out looks like.

A batch's memory grows with its *padded* size: rows are left-padded to the longest prompt
and every row runs to the longest ``max_new_tokens``, so a batch of ``n`` requests costs
about ``n * (longest prompt + longest new)`` tokens of KV cache and activations. At the
paper's resolution one Qwen2.5-VL image is up to 16,384 visual tokens, so a batch of 16
agent turns can be a quarter of a million tokens: the batch worker bounds each batch by
that count (``max_batch_tokens``) as well as by request count, splits a batch that runs out
of memory anyway, and lowers the budget it was given (:class:`TokenBudget`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CPU_BATCH_TOKENS",
    "TokenBudget",
    "default_batch_tokens",
    "is_out_of_memory",
    "release_cached_memory",
]

CPU_BATCH_TOKENS = 65_536  # a fixed default: host memory is not ours to measure and claim
GPU_MEMORY_SHARE = 0.5  # of the memory free when the model is loaded (others may share it)

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError``, Python's ``MemoryError``, or the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def release_cached_memory() -> None:
    """Give the allocator's cached blocks back after an out-of-memory error, so the retry
    with a smaller batch starts from a clean pool."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """What one token of a batch costs in a decoder's forward pass: its KV cache in every
    layer, plus the widest per-layer activations (attention and MLP intermediates) it
    passes through during prefill. An estimate: allocator slack and the vision tower are
    not in it, which is why the budget takes a share of free memory, not all of it."""
    text = getattr(config, "text_config", None) or config
    hidden = int(text.hidden_size)
    layers = int(text.num_hidden_layers)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    kv_cache = 2 * layers * kv_heads * head_dim
    activations = 6 * hidden + 3 * intermediate  # residual, norms, q/k/v/o; gate, up, act
    return (kv_cache + activations) * dtype_bytes


def default_batch_tokens(hf_model: Any) -> int:
    """The budget a model gets unless told otherwise: on a GPU, a share of the device's free
    memory divided by :func:`bytes_per_token`; elsewhere :data:`CPU_BATCH_TOKENS`."""
    device = getattr(hf_model, "device", None)
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return CPU_BATCH_TOKENS
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    dtype_bytes = torch.finfo(hf_model.dtype).bits // 8 if hf_model.dtype.is_floating_point else 2
    per_token = bytes_per_token(hf_model.config, dtype_bytes)
    return max(1, int(GPU_MEMORY_SHARE * free / per_token))


@dataclass
class TokenBudget:
    """The most padded tokens one batch may hold (``limit``; None: count only), lowered
    each time a batch runs out of memory. ``cuts`` records each change as (from, to).

    With ``derive``, the limit is computed when the first batch is formed rather than when
    the model is built: by then the other models sharing the device are loaded too, so
    each takes its share of what is really left."""

    limit: int | None
    cuts: list[tuple[int | None, int]] = field(default_factory=list)
    derive: Callable[[], int] | None = None

    def _resolve(self) -> None:
        if self.derive is not None:
            self.limit, self.derive = self.derive(), None

    def fits(self, tokens: int) -> bool:
        self._resolve()
        return self.limit is None or tokens <= self.limit

    def cut(self, failed_tokens: int, rows: int) -> None:
        """A batch of ``rows`` requests and ``failed_tokens`` tokens ran out of memory: its
        halves are what is tried next, so no batch may be larger than half of it (a single
        request: just smaller than it). Never raised again (memory is rarely given back)."""
        self._resolve()
        target = max(1, failed_tokens // 2 if rows > 1 else failed_tokens - 1)
        if self.limit is None or target < self.limit:
            self.cuts.append((self.limit, target))
            self.limit = target
