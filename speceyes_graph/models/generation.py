"""Batched generation: how a batch of prepared requests becomes replies.

One padded, left-aligned ``generate`` call per batch (rows may carry their own stop strings
and lengths), then each row decoded into an ``AIMessage``: the text cut at its stop string
(OpenAI semantics), the top-K log-probs of each kept token in the OpenAI format, usage, the
batch size, and DeepEyes tool calls when tools were bound. :class:`ChatTransformersVLM`
prepares the requests and hands batches here from its batch worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Sequence
from typing import Any, cast

from langchain_core.messages import AIMessage
from langchain_core.messages.ai import UsageMetadata

from ..protocol import parse_deepeyes
from .batching import RowKeys
from .collate import exact_groups, fill_value, pad_cat, pad_sequences, sequence_dim
from .image_cache import vision_keys
from .memory import is_out_of_memory

__all__ = ["BatchedGeneration", "GenerationKey", "can_join"]

# A request's generation settings, its batch key: (max_new_tokens, top_logprobs or None,
# stop strings, temperature); ChatTransformersVLM makes them, requests with equal keys batch.
GenerationKey = tuple[int, int | None, tuple[str, ...], float]


def _key(key: Hashable) -> GenerationKey:
    """One request's key as the scheduler hands it back (typed Hashable there)."""
    return cast(GenerationKey, key)  # the scheduler only holds keys ChatTransformersVLM made


class BatchedGeneration:
    """One checkpoint's ``generate`` over batches of prepared requests."""

    def __init__(self, hf_model: Any, processor: Any, model_name: str, parse_tool_calls: bool):
        self.hf_model = hf_model
        self.processor = processor
        self.model_name = model_name
        self.parse_tool_calls = parse_tool_calls
        self._pieces: dict[int, str] = {}  # token id -> text, for 64 top-K tokens a step
        self._stream: Any = None

    @staticmethod
    def batch_tokens(keys: Sequence[Hashable], prepared: Sequence[dict]) -> int:
        """Padded tokens of a would-be batch: every row is as long as the longest prompt plus
        the longest ``max_new_tokens`` (what the KV cache and activations are sized by)."""
        longest = max(p["n_prompt"] for p in prepared)
        return len(prepared) * (longest + max(_key(k)[0] for k in keys))

    @staticmethod
    def describe(keys: Sequence[Hashable], prepared: Sequence[dict]) -> str:
        """A batch in the words an out-of-memory error needs: tokens and image sizes."""
        tokens = BatchedGeneration.batch_tokens(keys, prepared)
        images = [size for p in prepared for size in p.get("image_sizes", ())]
        image_tokens = sum(p.get("image_tokens", 0) for p in prepared)
        largest = max(images, key=lambda wh: wh[0] * wh[1], default=None)
        seen = (
            f"; {len(images)} image(s), {image_tokens:,} image tokens, the largest "
            f"{largest[0]}x{largest[1]} px as the model sees it"
            if largest
            else "; no images"
        )
        rows = "1 request" if len(prepared) == 1 else f"a batch of {len(prepared)} requests"
        return (
            f"{rows} of {tokens:,} tokens (prompt {max(p['n_prompt'] for p in prepared):,}, "
            f"{max(_key(k)[0] for k in keys):,} new{seen})"
        )

    def _collate(self, prepared: Sequence[dict]) -> dict:
        """The requests' processor outputs as one batch (:mod:`.collate`): every tensor
        aligned with the token sequence, in whatever dimension, padded on the tokenizer's
        padding side; everything else joined and padded at the end, as the processor pads."""
        tokenizer = self.processor.tokenizer
        left = getattr(tokenizer, "padding_side", "left") != "right"
        lengths = [p["inputs"]["input_ids"].shape[1] for p in prepared]
        batch: dict[str, Any] = {}
        keys = dict.fromkeys(k for p in prepared for k in p["inputs"])
        for key in keys:
            values = [p["inputs"].get(key) for p in prepared]
            present = [v for v in values if v is not None]  # (no `in`: it compares tensors)
            dim = sequence_dim(values, lengths) if len(present) == len(values) else None
            if dim is not None:
                fill = fill_value(key, tokenizer.pad_token_id)
                batch[key] = pad_sequences(values, dim, fill, left=left)
            else:  # pixels, grids, image sizes: joined in request order, as the processor pads
                batch[key] = pad_cat(present)
        device = self.hf_model.device
        return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}

    def run_batch(self, key: Hashable, prepared: Sequence[dict], streamer: Any = None) -> list:
        if len(prepared) > 1:
            groups = exact_groups([p["inputs"] for p in prepared])
            if len(groups) > 1:  # padding one into the other would change replies
                return self._run_groups(key, prepared, groups, streamer)
        return self._run_batch(key, prepared, streamer)

    def _run_groups(
        self, key: Hashable, prepared: Sequence[dict], groups: list[list[int]], streamer: Any
    ) -> list:
        """One ``generate`` call per group (see :func:`~.collate.exact_groups`), the replies
        in the batch's order."""
        results: list[Any] = [None] * len(prepared)
        for group in groups:
            sub = RowKeys([key[i] for i in group]) if isinstance(key, RowKeys) else key
            replies = self._run_batch(sub, [prepared[i] for i in group], streamer)
            for i, reply in zip(group, replies, strict=True):
                results[i] = reply
        return results

    def _run_batch(self, key: Hashable, prepared: Sequence[dict], streamer: Any = None) -> list:
        import torch

        # one key for the batch, or one per row (requests that joined: see can_join)
        rows = [_key(k) for k in key] if isinstance(key, RowKeys) else [_key(key)] * len(prepared)
        max_new = max(k[0] for k in rows)
        _, top_k, _, temperature = rows[0]
        tokenizer = self.processor.tokenizer
        inputs = self._collate(prepared)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "return_dict_in_generate": True,
            "output_logits": bool(top_k),
            "pad_token_id": tokenizer.pad_token_id,
        }
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        prompt_len = inputs["input_ids"].shape[1]
        if len(set(rows)) == 1:
            if rows[0][2]:
                gen_kwargs.update(stop_strings=list(rows[0][2]), tokenizer=tokenizer)
        else:  # each row stops at its own stop strings and length
            gen_kwargs["stopping_criteria"] = _row_stopping(rows, prompt_len, tokenizer)
        if streamer is not None:
            gen_kwargs["streamer"] = streamer
        images = [k for p in prepared for k in p.get("image_keys", ())]
        out_of_memory = None
        with torch.inference_mode(), self._own_stream(), vision_keys(images):
            try:
                out = self.hf_model.generate(**inputs, **gen_kwargs)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                out_of_memory = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
            if out_of_memory is not None:  # raised outside the except: no frames kept alive
                del inputs
                raise MemoryError(
                    f"out of memory generating {self.describe(rows, prepared)}: {out_of_memory}"
                )
            generated = out.sequences[:, prompt_len:].tolist()
            step_top = None
            if top_k:  # per step: log-softmax of the raw logits, top-K only (never [B, T, V])
                step_top = []
                for t, logits in enumerate(out.logits):
                    logprobs = torch.log_softmax(logits.float(), dim=-1)
                    values, ids = torch.topk(logprobs, int(top_k), dim=-1)
                    chosen = out.sequences[:, prompt_len + t, None]  # the token each row took
                    picked = logprobs.gather(-1, chosen)[:, 0]
                    step_top.append((values.cpu(), ids.cpu(), picked.cpu()))
        eos = set(_as_list(self.hf_model.generation_config.eos_token_id)) | {tokenizer.pad_token_id}
        results = []
        for b, tokens in enumerate(generated):
            n_prompt = int(prepared[b]["inputs"]["input_ids"].shape[1])
            row_max, _, row_stops, _ = rows[b]
            results.append(
                self.decode(
                    b, tokens[:row_max], eos, row_stops, step_top, prepared[b]["tools"],
                    n_prompt, prepared[b].get("prefix", ""),
                )
            )  # fmt: skip
        for message in results:  # visible in traces and drafts: how well calls batched
            message.response_metadata["batch_size"] = len(prepared)
        return results

    def _own_stream(self) -> Any:
        """On a GPU, this model's own CUDA stream: the small model's drafts and the large
        model's judge calls (two workers) then run side by side instead of queueing on the
        default stream. A no-op elsewhere."""

        import torch

        device = getattr(self.hf_model, "device", None)
        if device is None or device.type != "cuda":
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return torch.cuda.stream(self._stream)

    def _token_text(self, token_id: int) -> str:
        """One token's text, as ``decode([id])`` gives it; cached, since top-K log-probs
        decode 64 tokens per step and per row."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self.processor.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._pieces) < 1 << 20:
                self._pieces[token_id] = text
        return text

    def decode(
        self,
        b: int,
        tokens: list[int],
        eos: set,
        stops: tuple,
        step_top,
        tools: bool,
        n_prompt: int = 0,
        prefix: str = "",
    ) -> AIMessage:
        """One reply: up to the first eos, stop strings cut (OpenAI semantics), log-probs,
        usage, and tool calls parsed when tools were declared. ``prefix`` is the forced
        start of the reply (``tool_choice``), which the reply text includes."""
        tokenizer = self.processor.tokenizer
        n = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))  # to first eos/pad
        finish = "stop" if n < len(tokens) else "length"
        tokens = tokens[:n]
        piece = self._token_text
        pieces = [piece(t) for t in tokens]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        kept = len(tokens)
        for s in stops:  # OpenAI semantics: the stop string is not part of the reply
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
                finish = "stop"
                acc, kept = "", 0
                for text_of_token in pieces:
                    if len(acc) >= cut:
                        break
                    acc += text_of_token
                    kept += 1
        metadata: dict[str, Any] = {"model_name": self.model_name, "finish_reason": finish}
        if step_top is not None:
            content = []
            for t in range(kept):
                values, ids, picked = step_top[t]
                top = [
                    {"token": piece(i), "logprob": v}
                    for v, i in zip(values[b].tolist(), ids[b].tolist(), strict=True)
                ]
                content.append(
                    {"token": pieces[t], "logprob": float(picked[b]), "top_logprobs": top}
                )
            metadata["logprobs"] = {"content": content}
        # the token details are NotRequired, imported from typing by langchain-core (3.11+):
        # mypy's 3.10 target does not see that, and takes them for required keys
        usage = UsageMetadata(  # type: ignore[typeddict-item]
            input_tokens=n_prompt, output_tokens=kept, total_tokens=n_prompt + kept
        )
        text = prefix + text
        calls = []
        if tools and self.parse_tool_calls and "<tool_call>" in text:
            parsed = parse_deepeyes(text)
            if parsed.answer is None:
                calls = parsed.tool_calls
        return AIMessage(
            content=text, tool_calls=calls, response_metadata=metadata, usage_metadata=usage
        )


def can_join(batch_key: Hashable, key: Hashable) -> bool:
    """Whether a request with ``key`` may join a batch formed for ``batch_key``: both greedy
    with the same log-prob setting, and it wants no more new tokens (so the batch runs no
    longer for it). Stop strings may differ: each row stops at its own."""
    max_new, top_k, _, temperature = _key(batch_key)
    other_max, other_top_k, _, other_temperature = _key(key)
    return temperature == other_temperature == 0.0 and top_k == other_top_k and other_max <= max_new


def _row_stopping(rows: Sequence[GenerationKey], prompt_len: int, tokenizer: Any) -> Any:
    """Stopping criteria for a batch whose rows have their own stop strings and lengths."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

    class Rows(StoppingCriteria):
        def __init__(self, inner: Any, mask: list[bool]):
            self.inner, self.mask = inner, torch.tensor(mask)

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return self.inner(input_ids, scores, **kwargs) & self.mask.to(input_ids.device)

    class RowLengths(StoppingCriteria):
        def __init__(self, lengths: list[int]):
            self.lengths = torch.tensor(lengths)

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return (input_ids.shape[1] - prompt_len) >= self.lengths.to(input_ids.device)

    criteria = StoppingCriteriaList([RowLengths([k[0] for k in rows])])
    for stops in {k[2] for k in rows if k[2]}:
        mask = [k[2] == stops for k in rows]
        criteria.append(Rows(StopStringCriteria(tokenizer, list(stops)), mask))
    return criteria


def _as_list(x: Any) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]
