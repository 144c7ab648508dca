"""Image preprocessing done once per (image, processor settings), shared by every call.

A query's image is seen by the large model twice or more: the judge, then every turn of the
agent loop (each turn re-sends the whole transcript: the image and all crops so far). The
processor's resize, normalise and patchify of an image depends only on its pixels and the
processor's settings, so :class:`CachedImageProcessor` keeps each image's output, keyed by
the content key the graph already gives it (a ``blob://`` sha256), and reuses it.

It wraps the processor's ``image_processor`` and takes the keys of the images of the
current call from :func:`image_keys` (the processor passes the images through in order).
Calls without keys (inline base64 images, other callers) go straight through. Where a
family's output for several images is its per-image outputs joined (Qwen-VL, Pixtral,
LLaVA-NeXT, LLaVA-OneVision: checked once per processor settings on two synthetic images),
the images of a call are processed and kept one by one; otherwise (Idefics3 groups an
image's tiles per prompt) the whole call's output is kept, keyed by all its images
(``tests/test_families.py`` checks both give the processor's own result).

Processed images are kept in host memory, by default in the process's
:func:`~speceyes_tools.memory.image_memory`: one LRU and one bound with the store's decoded
pixels, so an image's copies never add up past it. The vision tower's outputs live on the
model's device, a memory of their own (``speceyes_tools.memory`` says why).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from speceyes_tools.memory import ImageMemory, image_memory

from .collate import pad_cat

__all__ = ["CachedImageProcessor", "CachedVisionEncoder", "image_keys", "vision_keys"]

_KEYS: contextvars.ContextVar[Sequence[str | None] | None] = contextvars.ContextVar(
    "speceyes_image_keys", default=None
)


@contextmanager
def _naming(var: contextvars.ContextVar, keys: Sequence[str | None]) -> Iterator[None]:
    token = var.set(list(keys))
    try:
        yield
    finally:
        var.reset(token)


def image_keys(keys: Sequence[str | None]) -> Any:
    """Name the images of the processor call made inside the block (None: no name)."""
    return _naming(_KEYS, keys)


_PROBES = ((48, 64), (96, 40))  # (height, width) of the layout probe's two images


def _nested(images: Any) -> bool:
    """Whether the processor passed images grouped per prompt (``[[a, b], [c]]``)."""
    return (
        isinstance(images, (list, tuple)) and bool(images) and isinstance(images[0], (list, tuple))
    )


def _grouping(images: Any) -> Any:
    """The nesting of a call's images (which prompt each belongs to), without the pixels."""
    if isinstance(images, (list, tuple)):
        return tuple(_grouping(item) for item in images)
    return None


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return bool(a == b)


def _flat(images: Any) -> list:
    if isinstance(images, (list, tuple)):
        return [leaf for item in images for leaf in _flat(item)]
    return [images]


class _CountedCache:
    """Outputs kept in a part of an :class:`~speceyes_tools.memory.ImageMemory` (an LRU
    bounded by bytes), with hit and miss counts."""

    def __init__(self, memory: ImageMemory):
        self.hits = 0
        self.misses = 0
        self._cache = memory.part(_nbytes)

    def clear(self) -> None:
        self._cache.clear()


class CachedImageProcessor(_CountedCache):
    """An image processor whose per-image outputs are kept (LRU, bounded by bytes: by
    default :func:`~speceyes_tools.memory.image_memory`'s, shared with decoded pixels)."""

    def __init__(self, inner: Any, memory: ImageMemory | None = None):
        self.inner = inner
        self._layouts: dict[str, bool] = {}  # settings -> whether per-image outputs join
        super().__init__(image_memory() if memory is None else memory)

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped processor's
        if name in ("inner", "_cache", "_layouts"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, images: Any, *args: Any, **kwargs: Any) -> Any:
        keys = _KEYS.get()
        flat = _flat(images)
        if (
            args
            or keys is None
            or len(keys) != len(flat)
            or any(k is None for k in keys)
            or kwargs.get("return_tensors") != "pt"
        ):
            return self.inner(images, *args, **kwargs)
        from transformers import BatchFeature

        settings = repr(sorted(kwargs.items()))
        if len(flat) > 1 and not self._joins_per_image(images, settings, kwargs):
            # one entry for the whole call, keyed by its images and their grouping
            whole = (tuple(keys), _grouping(images), settings)
            return BatchFeature(self._one(images, whole, kwargs), tensor_type=None)
        nested = _nested(images)
        parts = [
            self._one([[image]] if nested else [image], (key, settings), kwargs)
            for image, key in zip(flat, keys, strict=True)
        ]
        joined = {name: pad_cat([p[name] for p in parts]) for name in parts[0]}
        return BatchFeature(joined, tensor_type=None)

    def _joins_per_image(self, images: Any, settings: str, kwargs: dict) -> bool:
        """Whether this processor's output for several images is its outputs for each image
        alone, joined by :func:`pad_cat` (Qwen-VL, Pixtral, LLaVA-OneVision do; Idefics3
        groups an image's tiles per prompt): tried once per settings on two synthetic images
        of different shapes, in the nesting the processor used."""
        known = self._layouts.get(settings)
        if known is None:
            import numpy as np

            rng = np.random.default_rng(0)
            probes = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in _PROBES]
            nested = _nested(images)
            try:
                together = dict(self.inner([probes] if nested else probes, **kwargs))
                alone = [dict(self.inner([[p]] if nested else [p], **kwargs)) for p in probes]
                joined = {name: pad_cat([a[name] for a in alone]) for name in alone[0]}
                known = set(joined) == set(together) and all(
                    _same(joined[name], together[name]) for name in together
                )
            except Exception:  # noqa: BLE001 - a layout the probe cannot read: keep whole calls
                known = False
            self._layouts[settings] = known
        return known

    def _one(self, images: list, key: tuple, kwargs: dict) -> dict:
        hit = self._cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        out = dict(self.inner(images, **kwargs))
        self.misses += 1
        self._cache.put(key, out)
        return out


# --- the vision tower's output --------------------------------------------------------------

_VISION_KEYS: contextvars.ContextVar[Sequence[str | None] | None] = contextvars.ContextVar(
    "speceyes_vision_keys", default=None
)


def vision_keys(keys: Sequence[str | None]) -> Any:
    """Name the images, in batch order, of the ``generate`` call made inside the block."""
    return _naming(_VISION_KEYS, keys)


class CachedVisionEncoder(_CountedCache):
    """Wraps a model's ``get_image_features``: each image's encoder output is kept by content
    key and reused by later calls (the judge's image on the agent's turns, the original image
    on every turn after a zoom).

    Images not cached are encoded together, as without the cache, and split per image. Two
    layouts split: Qwen-VL's, whose patches of all images are flattened and counted by
    ``image_grid_thw`` (outputs per-image tuples in ``pooler_output``, lists of them in
    ``deepstack_features``, or tensors over all patches), and one row per image (Gemma 3,
    PaliGemma, Mistral 3, LLaVA-NeXT, LLaVA-OneVision prompts of one image: every input
    tensor's first dimension counts images; ``pooler_output``, all the model reads, is split
    by image). Anything else (InternVL's tiles of one image on several rows, Idefics3's rows
    per prompt, a LLaVA-OneVision prompt of two images, whose features depend on it) is
    encoded uncached, as before: correct, just not reused.

    Exact: an image's output does not depend on the other images encoded with it (checked
    bitwise, fp32 and bf16, on the full-size Qwen2.5-VL-7B and Qwen3-VL-2B vision towers;
    ``tests/test_throughput.py`` and ``tests/test_families.py`` check equal logits end to
    end).
    """

    def __init__(self, encode: Any, merge_size: int, max_bytes: int = 256 << 20):
        self.encode = encode
        self.merge_size = merge_size
        self._signature = inspect.signature(encode)
        super().__init__(ImageMemory(max_bytes))  # device memory: a bound of its own
        functools.update_wrapper(self, encode)  # generate inspects the signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        keys = _VISION_KEYS.get()
        if keys is None or any(k is None for k in keys) or kwargs.get("return_dict") is False:
            return self.encode(*args, **kwargs)
        try:
            named = self._signature.bind(*args, **kwargs).arguments
        except TypeError:
            return self.encode(*args, **kwargs)
        for name, param in self._signature.parameters.items():
            if param.kind is param.VAR_KEYWORD:
                named = {**{k: v for k, v in named.items() if k != name}, **named.get(name, {})}
        layout = self._layout(named, len(keys))
        if layout is None:
            return self.encode(**named)
        return self._cached(named, [str(k) for k in keys], *layout)

    def _layout(self, named: dict, n: int) -> tuple[list[str], list[int], list[int]] | None:
        """(the inputs split per image, each image's input rows, its output tokens), or None
        where the inputs are not one of the two layouts that split."""
        import torch

        grid = named.get("image_grid_thw")
        pixels = named.get("pixel_values")
        if not isinstance(pixels, torch.Tensor):
            return None
        if grid is not None:
            if len(grid) != n:
                return None
            patches = [int(p) for p in grid.prod(-1).tolist()]
            return (
                ["pixel_values", "image_grid_thw"],
                patches,
                [p // self.merge_size**2 for p in patches],
            )
        tensors = [k for k, v in named.items() if isinstance(v, torch.Tensor) and v.ndim >= 1]
        if any(named[k].shape[0] != n for k in tensors):
            return None
        return tensors, [1] * n, [1] * n

    def _cached(self, named: dict, keys: Sequence[str], split: list[str], rows: list[int], tokens: list[int]) -> Any:  # fmt: skip
        import torch

        starts = [0, *itertools.accumulate(rows)]
        found = {k: self._cache.get(k) for k in keys}
        missing = [i for i, k in enumerate(keys) if found[k] is None]
        if missing:  # encoded together, as without the cache, then split per image
            part = dict(named)
            for name in split:
                per_row = name == "pixel_values" or rows == [1] * len(rows)
                bounds = starts if per_row else list(range(len(keys) + 1))
                part[name] = torch.cat([named[name][bounds[i] : bounds[i + 1]] for i in missing])
            out = self.encode(**part)
            grid = "image_grid_thw" in split
            for j, i in enumerate(missing):
                one = _one_image(
                    out, j, [tokens[m] for m in missing], [rows[m] for m in missing], not grid
                )
                if not grid:  # one row per image: only the features the model reads
                    one = {"__class__": one["__class__"], "pooler_output": one["pooler_output"]}
                    if not _is_part(one["pooler_output"]):
                        return self.encode(**named)  # not split by image after all
                found[keys[i]] = one
            for i in missing:
                self._cache.put(keys[i], found[keys[i]])
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        template = found[keys[0]]["__class__"]
        fields = {
            name: _join([found[k][name] for k in keys])
            for name in found[keys[0]]
            if name != "__class__"
        }
        return template(**fields)


_WHOLE = object()  # an output field not split by image


def _is_part(value: Any) -> bool:
    return value is not _WHOLE and value is not None


def _one_image(out: Any, j: int, tokens: list[int], patches: list[int], rows: bool = False) -> dict:
    """Image ``j``'s part of an encoder output (per-image tuples, lists of them, or tensors
    over all merged tokens or all patches); a field that is none of these is kept whole.
    ``rows``: the output has one entry per image (a sequence of them becomes a tuple of
    one); a field that is not is marked ``_WHOLE``."""
    import torch

    def part(value: Any) -> Any:
        if rows and isinstance(value, (tuple, list)):
            return (value[j],) if len(value) == len(tokens) else _WHOLE
        if isinstance(value, tuple) and len(value) == len(tokens):
            return (value[j],)
        if isinstance(value, list):
            return [part(v) for v in value]
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            for sizes in (patches, tokens):
                if value.shape[0] == sum(sizes):
                    start = sum(sizes[:j])
                    return value[start : start + sizes[j]]
            return _WHOLE if rows else value
        return value

    one = {name: part(value) for name, value in out.items()}
    one["__class__"] = type(out)
    return one


def _join(parts: list) -> Any:
    import torch

    first = parts[0]
    if isinstance(first, tuple):
        return tuple(t for p in parts for t in p)
    if isinstance(first, list):
        return [_join([p[i] for p in parts]) for i in range(len(first))]
    if isinstance(first, torch.Tensor) and first.ndim >= 1:
        return torch.cat(parts, dim=0)
    return first


def _nbytes(out: dict) -> int:
    """Bytes of the tensors in a cached output (nested tuples and lists included)."""

    def size(value: Any) -> int:
        if isinstance(value, (tuple, list)):
            return sum(size(v) for v in value)
        return int(getattr(value, "nbytes", 0))

    return sum(size(v) for k, v in out.items() if k != "__class__")
