"""Image preprocessing done once per (image, processor settings), shared by every call.

A query's image is seen by the large model twice or more: the judge, then every turn of the
agent loop (each turn re-sends the whole transcript: the image and all crops so far). The
processor's resize, normalise and patchify of an image depends only on its pixels and the
processor's settings, so :class:`CachedImageProcessor` keeps each image's output, keyed by
the content key the graph already gives it (a ``blob://`` sha256), and reuses it.

It wraps the processor's ``image_processor`` and takes the keys of the images of the
current call from :func:`image_keys` (the processor passes the images through in order).
Calls without keys (inline base64 images, other callers) go straight through. The images
of one call are processed one by one and concatenated, which is what the Qwen-VL image
processors do internally (``tests/test_throughput.py`` checks the result is equal).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


class _BytesLRU:
    """Values kept by key, least recently used dropped first, bounded by total bytes."""

    def __init__(self, max_bytes: int, size: Any):
        self.max_bytes = max_bytes
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        size = self.size(value)
        with self._lock:
            if key in self._items or size > self.max_bytes:
                return
            self._items[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= self.size(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


def _flat(images: Any) -> list:
    if isinstance(images, (list, tuple)):
        return [leaf for item in images for leaf in _flat(item)]
    return [images]


class _CountedCache:
    """A byte-bounded LRU with hit and miss counts; ``max_bytes`` can be changed live."""

    def __init__(self, max_bytes: int):
        self.hits = 0
        self.misses = 0
        self._cache = _BytesLRU(max_bytes, _nbytes)

    @property
    def max_bytes(self) -> int:
        return self._cache.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._cache.max_bytes = value


class CachedImageProcessor(_CountedCache):
    """An image processor whose per-image outputs are kept (LRU, bounded by bytes)."""

    def __init__(self, inner: Any, max_bytes: int = 1 << 30):
        self.inner = inner
        super().__init__(max_bytes)

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped processor's
        if name in ("inner", "_cache"):
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
        import torch
        from transformers import BatchFeature

        settings = repr(sorted(kwargs.items()))
        parts = [self._one(image, (key, settings), kwargs) for image, key in zip(flat, keys)]
        names = list(parts[0])
        if any(list(p) != names for p in parts) or not all(
            isinstance(v, torch.Tensor) for p in parts for v in p.values()
        ):  # not a per-image tensor layout we know how to join: process uncached
            return self.inner(images, *args, **kwargs)
        joined = {n: torch.cat([p[n] for p in parts], dim=0) for n in names}
        return BatchFeature(joined, tensor_type="pt")

    def _one(self, image: Any, key: tuple, kwargs: dict) -> dict:
        hit = self._cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        out = dict(self.inner([image], **kwargs))
        self.misses += 1
        self._cache.put(key, out)
        return out

    def clear(self) -> None:
        self._cache.clear()


# --- the vision tower's output --------------------------------------------------------------

_VISION_KEYS: contextvars.ContextVar[Sequence[str | None] | None] = contextvars.ContextVar(
    "speceyes_vision_keys", default=None
)


def vision_keys(keys: Sequence[str | None]) -> Any:
    """Name the images, in batch order, of the ``generate`` call made inside the block."""
    return _naming(_VISION_KEYS, keys)


class CachedVisionEncoder(_CountedCache):
    """Wraps a Qwen-VL base model's ``get_image_features``: each image's encoder output is
    kept by content key and reused by later calls (the judge's image on the agent's turns,
    the original image on every turn after a zoom).

    Exact: an image's output does not depend on the other images encoded with it (checked
    bitwise, fp32 and bf16, on the full-size Qwen2.5-VL-7B and Qwen3-VL-2B vision towers;
    ``tests/test_throughput.py`` checks equal logits end to end), so images not cached are
    encoded together, as without the cache, and split. Outputs are per-image tuples
    (``pooler_output``), lists of them (``deepstack_features``) or tensors over all patches.
    """

    def __init__(self, encode: Any, merge_size: int, max_bytes: int = 256 << 20):
        self.encode = encode
        self.merge_size = merge_size
        super().__init__(max_bytes)
        functools.update_wrapper(self, encode)  # generate inspects the signature

    def __call__(self, pixel_values: Any, image_grid_thw: Any = None, **kwargs: Any) -> Any:
        keys = _VISION_KEYS.get()
        if keys is None or image_grid_thw is None or len(keys) != len(image_grid_thw):
            return self.encode(pixel_values, image_grid_thw, **kwargs)
        if any(k is None for k in keys) or kwargs.get("return_dict") is False:
            return self.encode(pixel_values, image_grid_thw, **kwargs)
        import torch

        patches = image_grid_thw.prod(-1).tolist()
        starts = [0, *itertools.accumulate(patches)]
        found = {k: self._cache.get(k) for k in keys}
        missing = [i for i, k in enumerate(keys) if found[k] is None]
        if missing:  # encoded together, as without the cache, then split per image
            pixels = torch.cat([pixel_values[starts[i] : starts[i + 1]] for i in missing])
            out = self.encode(pixels, image_grid_thw[missing], **kwargs)
            tokens = [patches[i] // self.merge_size**2 for i in missing]
            for j, i in enumerate(missing):
                found[keys[i]] = _one_image(out, j, tokens, [patches[m] for m in missing])
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

    def clear(self) -> None:
        self._cache.clear()


def _one_image(out: Any, j: int, tokens: list[int], patches: list[int]) -> dict:
    """Image ``j``'s part of an encoder output (per-image tuples, lists of them, or tensors
    over all merged tokens or all patches)."""
    import torch

    def part(value: Any) -> Any:
        if isinstance(value, tuple) and len(value) == len(tokens):
            return (value[j],)
        if isinstance(value, list):
            return [part(v) for v in value]
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            for sizes in (patches, tokens):
                if value.shape[0] == sum(sizes):
                    start = sum(sizes[:j])
                    return value[start : start + sizes[j]]
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
