"""Decoded images held in memory: each decoded once, memory bounded, shared read-only.

Tools and model calls ask for the pixels of the same few images, often at once, and the
images can be huge (8K is 100 MB of RGB). Decoding dominates the cost, so arrays are kept;
memory is then the danger, so both what is kept and what is being decoded are bounded:

- kept arrays live in an LRU bounded by bytes (the oldest go first; an array over the whole
  bound is handed out but not kept), so a long run cannot grow without limit; the bound is
  an :class:`~speceyes_tools.memory.ImageMemory`'s, shared with the other host-memory
  copies of images (a model's processed images), so that one image's copies have one bound;
- concurrent requests for one key wait for a single decode instead of each decoding it;
- a decode is priced from the header (:func:`~speceyes_tools.codec.read_header`) before any
  pixel is allocated, refused over a pixel cap, and waits for room in a byte budget, so a
  batch of huge images queues instead of exhausting memory;
- arrays are frozen: they are shared between threads, and a tool writing into one would
  corrupt what every later reader sees.

The cache knows keys, not references. :class:`~speceyes_tools.images.ImageStore` turns a
reference into a key (content for blobs; path, size and mtime for files) and a loader under
its policy, and keeps the pixels of its model views here too, so that originals and views
share one memory bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .codec import decode_image, read_header
from .deadlines import EarliestDeadlineFirst, time_left
from .memory import ImageMemory
from .sources import ImageLoadError, redact

__all__ = ["DecodeBudget", "DecodeCache"]


class DecodeBudget:
    """At most ``limit`` bytes of decodes in flight; the rest wait (up to their deadline).

    A decode needs its file and its pixels at once; bounding the sum over decodes in flight,
    not their number, lets many small images through while two 8K ones take turns.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.in_use = 0
        self.peak = 0  # the most ever held at once (tests, benchmarks)
        self._cond = threading.Condition()

    def acquire(self, n: int, name: str) -> None:
        """Wait for ``n`` bytes; a decode larger than the whole budget fails at once, since
        waiting could never let it in."""
        if n > self.limit:
            raise ImageLoadError(
                f"decoding image {name} needs {n / 2**20:.0f} MiB, more than this store's "
                f"decode budget of {self.limit / 2**20:.0f} MiB"
            )
        with self._cond:
            ok = self._cond.wait_for(lambda: self.in_use + n <= self.limit, time_left())
            if not ok:
                raise ImageLoadError(f"timed out waiting for memory to decode image {name}")
            self.in_use += n
            self.peak = max(self.peak, self.in_use)

    def release(self, n: int) -> None:
        with self._cond:
            self.in_use -= n
            self._cond.notify_all()


class DecodeCache:
    """Key -> read-only RGB array: an LRU bounded by bytes over single-flight, budgeted decodes.

    Args:
        memory: where arrays are kept (an LRU bounded by bytes, shared with other caches of
            image data); one of 0 bytes keeps none (every :meth:`get` decodes).
        max_decode_bytes: decodes in flight at once, in bytes (file plus pixels); more wait.
        work: the gate decodes run under, shared with the owner's resizes and encodes so that
            one earliest-deadline-first order covers all CPU work on images.
    """

    def __init__(
        self, memory: ImageMemory, *, max_decode_bytes: int, work: EarliestDeadlineFirst
    ) -> None:
        self.memory = memory
        self.budget = DecodeBudget(max_decode_bytes)
        self.decodes = 0  # how many times an image was actually decoded (tests, benchmarks)
        self._work = work
        self._arrays = memory.part(lambda arr: int(arr.nbytes))
        self._lock = threading.Lock()  # guards the two below; the arrays have the memory's
        self._loading: dict[Any, threading.Lock] = {}

    def get(self, key: Any, load: Callable[[], bytes], ref: str, max_pixels: int) -> np.ndarray:
        """The array under ``key``, decoding ``load()`` (named ``ref`` in errors, redacted)
        on a miss. ``load`` runs inside the work gate, so reading a file or waiting on a
        blob counts as the decode's work and is skipped entirely on a hit."""
        arr: np.ndarray | None = self._arrays.get(key)
        if arr is not None:
            return arr
        with self._lock:
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:  # concurrent requests for one image wait for a single decode
            arr = self._arrays.get(key)
            if arr is not None:
                return arr
            try:
                with self._work("image decode"):
                    arr = self.decode(load(), redact(ref), max_pixels)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self.decodes += 1
            return self.keep(key, arr)

    def decode(self, data: bytes, name: str, max_pixels: int) -> np.ndarray:
        """Decode ``data`` (uncached) within the pixel cap and the memory budget: the header
        prices the decode before anything is allocated, so refusing or waiting is cheap."""
        header = read_header(data, name)
        if header.pixels > max_pixels:
            raise ImageLoadError(
                f"image {name} is {header.width}x{header.height} ({header.pixels / 1e6:.1f} MP); "
                f"the limit is {max_pixels / 1e6:.0f} MP"
            )
        need = header.decode_bytes + len(data)
        self.budget.acquire(need, name)
        try:
            return decode_image(data, name, header=header)
        finally:
            self.budget.release(need)

    def keep(self, key: Any, arr: np.ndarray) -> np.ndarray:
        """Hold ``arr`` under ``key`` (frozen, evicting the least recently used to fit) and
        return it. A key already held keeps its first array, so every reader shares one copy."""
        arr.setflags(write=False)  # shared between threads: nobody may write into it
        self._arrays.put(key, arr)
        return arr

    def peek(self, key: Any) -> np.ndarray | None:
        """The array if held, without decoding it."""
        arr: np.ndarray | None = self._arrays.get(key)
        return arr

    def __contains__(self, key: Any) -> bool:
        return key in self._arrays

    def holds_all(self, keys: Iterable[Any]) -> bool:
        """Whether every key is held, checked at one instant."""
        return self._arrays.holds_all(keys)

    def forget(self, matches: Callable[[Any], bool]) -> None:
        """Drop every array whose key ``matches`` (the owner knows what its keys mean)."""
        self._arrays.forget(matches)

    def clear(self) -> None:
        """Drop every array and reset :attr:`decodes`."""
        self._arrays.clear()
        with self._lock:
            self.decodes = 0
