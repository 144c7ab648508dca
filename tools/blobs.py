"""Where image bytes live while queries need them: content-addressed blobs.

Graph state and checkpoints hold only ``blob://<sha256>`` keys; the bytes (a ``data:``
input, a fetched URL, a zoomed crop, the image as a model sees it) live in a blob store.
Keys are the SHA-256 of the bytes, so the same image stored twice is stored once, a key
cannot be guessed without having the image, and a key always means the same pixels. (A
model view in an in-process store is keyed by the SHA-256 of its pixels instead, and its
PNG written on first read: see ``ImageStore``; the same three properties hold.)

- :class:`MemoryBlobs` (the default): an in-process LRU bounded by bytes, for scripts,
  notebooks and batch runs;
- :class:`DirectoryBlobs`: files under a folder, for servers whose threads outlive a
  process (``langgraph dev`` reloads, several workers sharing a volume);
- anything with ``put(key, data)`` and ``get(key) -> bytes | None`` (a :class:`BlobStore`),
  e.g. an object store.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["BLOB_SCHEME", "BlobStore", "DirectoryBlobs", "MemoryBlobs", "blob_key", "is_blob_key"]

BLOB_SCHEME = "blob://"
_KEY = re.compile(r"^blob://[0-9a-f]{64}$")


def blob_key(data: bytes) -> str:
    """The content address of ``data``."""
    return BLOB_SCHEME + hashlib.sha256(data).hexdigest()


def is_blob_key(ref: object) -> bool:
    return isinstance(ref, str) and _KEY.match(ref) is not None


@runtime_checkable
class BlobStore(Protocol):
    """The two operations an image store needs from its backend."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...


class MemoryBlobs:
    """A thread-safe LRU of blobs bounded by total bytes (oldest-used evicted first)."""

    def __init__(self, max_bytes: int = 512 * 2**20):
        self.max_bytes = max_bytes
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return
            self._data[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._data) > 1:
                _, old = self._data.popitem(last=False)
                self._bytes -= len(old)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            data = self._data.get(key)
            if data is not None:
                self._data.move_to_end(key)
            return data

    def discard(self, key: str) -> None:
        with self._lock:
            data = self._data.pop(key, None)
            if data is not None:
                self._bytes -= len(data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)


class DirectoryBlobs:
    """Blobs as files ``ROOT/ab/abcdef...``, written atomically; safe across processes.

    ``max_bytes`` (optional) bounds the folder: every ``prune_every`` writes the oldest files
    (by modification time; a read refreshes it) are removed until the folder fits. Call
    :meth:`prune` yourself for an age-based policy.
    """

    def __init__(
        self, root: str | os.PathLike, *, max_bytes: int | None = None, prune_every: int = 64
    ):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.prune_every = prune_every
        self._writes = 0
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        if not is_blob_key(key):
            raise KeyError(f"not a blob key: {key[:80]!r}")
        digest = key[len(BLOB_SCHEME) :]
        return self.root / digest[:2] / digest

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if path.exists():
            return
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self._writes += 1
            due = self.max_bytes is not None and self._writes % self.prune_every == 0
        if due:
            self.prune(max_bytes=self.max_bytes)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            os.utime(path)  # recently used: pruned last
        except OSError:
            pass
        return data

    def prune(self, *, max_bytes: int | None = None, max_age_s: float | None = None) -> int:
        """Remove blobs older than ``max_age_s`` and then the oldest until under ``max_bytes``."""
        files = []
        for path in self.root.glob("??/*"):
            if path.name.startswith(".tmp-"):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        files.sort()
        removed = 0
        total = sum(size for _, size, _ in files)
        now = time.time()
        for mtime, size, path in files:
            too_old = max_age_s is not None and now - mtime > max_age_s
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big):
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed
