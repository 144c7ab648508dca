"""One memory bound for an image's copies in host memory, however many caches hold them.

An image is held in host memory several ways at once: its decoded pixels and its model
views' pixels (:class:`~speceyes_tools.decode_cache.DecodeCache`) and, for each local model,
its processed tensors (``speceyes_graph.models.image_cache``). Bounded one by one, the bounds
add up (1 GiB decoded plus 1 GiB processed per model) and none can use what another leaves
idle, although which copy is worth keeping changes with the work: a batch of new images
needs decodes, an agent loop re-sending one image needs its processed tensors. So they share
one LRU: each cache is a *part* of an :class:`ImageMemory`, and an entry of any part that
needs room evicts the least recently used entries of every part, keeping the sum under one
bound. The default store and the models' processors share :func:`image_memory`.

Two kinds of image memory stay out of it. The vision tower's outputs live on the model's
device, a pool of its own whose room is weighed against the model's batches, not against
host memory: that cache is an :class:`ImageMemory` of its own (``vision_cache_bytes``).
And encoded bytes in :class:`~speceyes_tools.blobs.MemoryBlobs` are not a cache: a blob is
the only copy of an input or a crop, which evicting for pixels would lose.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from operator import itemgetter
from typing import Any

from cachetools import LRUCache

__all__ = ["DEFAULT_IMAGE_MEMORY", "ImageMemory", "MemoryPart", "image_memory"]

_PARTS = itertools.count()


class ImageMemory:
    """An LRU of several caches' entries together, bounded by their total bytes (thread-safe:
    cachetools' caches are not, so every part goes through :attr:`lock`).

    Args:
        max_bytes: the most all parts hold together; 0 holds nothing.
    """

    def __init__(self, max_bytes: int) -> None:
        self.lock = threading.Lock()
        # (part, key) -> (value, its bytes)
        self.entries: LRUCache[tuple[int, Hashable], tuple[Any, int]] = LRUCache(
            max_bytes, getsizeof=itemgetter(1)
        )
        self._gone: list[int] = []  # parts garbage-collected: their entries go on next use

    @property
    def max_bytes(self) -> int:
        return int(self.entries.maxsize)

    @property
    def nbytes(self) -> int:
        """Bytes held by all parts together."""
        return int(self.entries.currsize)

    def part(self, size: Callable[[Any], int]) -> MemoryPart:
        """A cache's share of this memory; ``size`` gives a value's bytes."""
        return MemoryPart(self, size)

    def _sweep(self) -> None:
        """Drop the entries of parts collected since the last sweep; call under :attr:`lock`
        (a part's finalizer only queues it, since it may run while the lock is held)."""
        gone: set[int] = set()
        while self._gone:
            gone.add(self._gone.pop())
        if gone:
            self._drop(lambda k: k[0] in gone)

    def _drop(self, matches: Callable[[tuple[int, Hashable]], bool]) -> None:
        for key in [k for k in self.entries if matches(k)]:
            del self.entries[key]


class MemoryPart:
    """One cache's entries in an :class:`ImageMemory`: a byte-bounded LRU whose bound and
    order it shares with the memory's other parts. Its entries go when it is collected."""

    def __init__(self, memory: ImageMemory, size: Callable[[Any], int]) -> None:
        self.memory, self.size = memory, size
        self._id = next(_PARTS)
        weakref.finalize(self, memory._gone.append, self._id)

    def get(self, key: Hashable) -> Any:
        """The value under ``key`` (now the most recently used), or None."""
        with self.memory.lock:
            entry = self.memory.entries.get((self._id, key))
        return None if entry is None else entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value``, evicting the least recently used entries of any part to fit. A key
        already held keeps its value (readers share one copy); a value over the whole bound
        is not kept."""
        size = self.size(value)
        memory = self.memory
        with memory.lock:
            memory._sweep()
            if (self._id, key) not in memory.entries and size <= memory.max_bytes:
                memory.entries[self._id, key] = (value, size)

    def __contains__(self, key: Hashable) -> bool:
        with self.memory.lock:
            return (self._id, key) in self.memory.entries

    def holds_all(self, keys: Iterable[Hashable]) -> bool:
        """Whether every key is held, checked at one instant."""
        with self.memory.lock:
            return all((self._id, key) in self.memory.entries for key in keys)

    def forget(self, matches: Callable[[Any], bool]) -> None:
        """Drop this part's entries whose key ``matches``."""
        with self.memory.lock:
            self.memory._drop(lambda k: k[0] == self._id and matches(k[1]))

    def clear(self) -> None:
        self.forget(lambda _: True)


DEFAULT_IMAGE_MEMORY = 2 << 30
"""What the old separate bounds of decoded pixels (1 GiB) and one model's processed images
(1 GiB) allowed together."""

_process_memory: ImageMemory | None = None
_process_memory_lock = threading.Lock()


def image_memory() -> ImageMemory:
    """The process's image memory, shared by the default store, every store made without
    ``max_bytes`` and every local model's processor (a second model does not add its own
    bound).

    Its bound is :data:`DEFAULT_IMAGE_MEMORY` (2 GiB) unless the environment variable
    ``SPECEYES_IMAGE_MEMORY_BYTES`` gives another, read at first use: a server's processes
    are sized by their deployment, not by code that builds the graph."""
    global _process_memory
    with _process_memory_lock:
        if _process_memory is None:
            _process_memory = ImageMemory(_bound_from_environment())
        return _process_memory


def _bound_from_environment() -> int:
    text = os.environ.get("SPECEYES_IMAGE_MEMORY_BYTES", "").strip()
    if not text:
        return DEFAULT_IMAGE_MEMORY
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"SPECEYES_IMAGE_MEMORY_BYTES must be a whole number of bytes, 0 or more "
            f"(0 keeps no images in memory), got {text!r:.40}"
        )
    return value
