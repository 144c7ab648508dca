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
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["CachedImageProcessor", "image_keys"]

_KEYS: contextvars.ContextVar[Sequence[str | None] | None] = contextvars.ContextVar(
    "speceyes_image_keys", default=None
)


@contextmanager
def image_keys(keys: Sequence[str | None]) -> Iterator[None]:
    """Name the images of the processor call made inside the block (None: no name)."""
    token = _KEYS.set(list(keys))
    try:
        yield
    finally:
        _KEYS.reset(token)


def _flat(images: Any) -> list:
    if isinstance(images, (list, tuple)):
        return [leaf for item in images for leaf in _flat(item)]
    return [images]


class CachedImageProcessor:
    """An image processor whose per-image outputs are kept (LRU, bounded by bytes)."""

    def __init__(self, inner: Any, max_bytes: int = 1 << 30):
        self.inner = inner
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._cache: OrderedDict[tuple, dict] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped processor's
        if name == "inner":
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
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        out = dict(self.inner([image], **kwargs))
        size = sum(getattr(v, "nbytes", 0) for v in out.values())
        with self._lock:
            self.misses += 1
            if key not in self._cache and size <= self.max_bytes:
                self._cache[key] = out
                self._bytes += size
                while self._bytes > self.max_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._bytes -= sum(getattr(v, "nbytes", 0) for v in old.values())
        return out

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._bytes = 0
