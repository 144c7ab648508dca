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
- :class:`FsspecBlobs`: any fsspec filesystem (``s3://``, ``gs://``, ``az://`` with the
  user's credentials), for graph workers on several machines;
- :class:`PostgresBlobs`: a table in the Postgres database the checkpoints already use;
- anything with ``put(key, data)`` and ``get(key) -> bytes | None`` (a :class:`BlobStore`).

:func:`blobs_from_url` picks one from a URL (the served graphs read ``SPECEYES_BLOB_URL``).
The shared ones take a size bound and an age limit (``prune``), since nothing else deletes
a thread's images.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from cachetools import LRUCache

__all__ = [
    "BLOB_SCHEME",
    "BlobStore",
    "DirectoryBlobs",
    "FsspecBlobs",
    "MemoryBlobs",
    "PostgresBlobs",
    "blob_key",
    "blobs_from_url",
    "is_blob_key",
]

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
    """A thread-safe LRU of blobs bounded by total bytes (oldest-used evicted first). A blob
    over the whole bound is kept alone, counted as the bound: a blob is the only copy of an
    input or a crop, so the newest is never refused."""

    def __init__(self, max_bytes: int = 512 * 2**20):
        self.max_bytes = max_bytes
        bound = max(max_bytes, 1)  # a bound of 0 keeps the newest alone, as one over it does
        self._data: LRUCache[str, bytes] = LRUCache(
            bound, getsizeof=lambda data: min(len(data), bound)
        )
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        _digest(key)  # the same keys as every other backend
        with self._lock:
            self._data[key] = data  # already held: the same bytes, now the newest

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def discard(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    @property
    def nbytes(self) -> int:
        return int(self._data.currsize)

    def __len__(self) -> int:
        return len(self._data)


def _digest(key: str) -> str:
    if not is_blob_key(key):
        raise KeyError(f"not a blob key: {key[:80]!r}")
    return key[len(BLOB_SCHEME) :]


class _Pruned:
    """Runs ``prune(max_bytes=...)`` every ``prune_every`` writes, when there is a bound."""

    max_bytes: int | None
    max_age_s: float | None
    prune_every: int
    _writes: int
    _lock: threading.Lock

    def _count_write(self) -> None:
        with self._lock:
            self._writes += 1
            due = self._writes % self.prune_every == 0
        if due and (self.max_bytes is not None or self.max_age_s is not None):
            self.prune(max_bytes=self.max_bytes, max_age_s=self.max_age_s)

    def prune(self, *, max_bytes: int | None = None, max_age_s: float | None = None) -> int:
        raise NotImplementedError


_Name = TypeVar("_Name")  # how a store names an entry: a Path, an fsspec path


def _prune_oldest(
    entries: Sequence[tuple[float, int, _Name]],
    max_bytes: int | None,
    max_age_s: float | None,
    remove: Callable[[_Name], object],
) -> int:
    """Remove from (time, size, name) entries, oldest first: those over the age, then until
    the rest fit in ``max_bytes``. Returns how many went."""
    total = sum(size for _, size, _ in entries)
    now, removed = time.time(), 0
    for stamp, size, name in entries:
        too_old = max_age_s is not None and now - stamp > max_age_s
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            continue
        try:
            remove(name)
        except FileNotFoundError:  # another worker pruned it first
            pass
        total -= size
        removed += 1
    return removed


class DirectoryBlobs(_Pruned):
    """Blobs as files ``ROOT/ab/abcdef...``, written atomically; safe across processes.

    ``max_bytes`` / ``max_age_s`` (optional) bound the folder: every ``prune_every`` writes,
    files unused for ``max_age_s`` go, then the oldest (by modification time; a read
    refreshes it) until the folder fits. Or call :meth:`prune` from a scheduled job.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        prune_every: int = 64,
    ):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.max_age_s, self.prune_every = max_bytes, max_age_s, prune_every
        self._writes = 0
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        digest = _digest(key)
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
        self._count_write()

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
        entries = []
        for path in self.root.glob("??/*"):
            if path.name.startswith(".tmp-"):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, path))
        entries.sort()
        return _prune_oldest(entries, max_bytes, max_age_s, lambda p: p.unlink())


class FsspecBlobs(_Pruned):
    """Blobs as objects ``URL/ab/abcdef...`` on an fsspec filesystem: a bucket every worker
    reaches (``s3://bucket/speceyes``, ``gs://...``; install ``s3fs`` / ``gcsfs``), with the
    credentials fsspec finds (environment, config files) or ``storage_options``.

    Keys are content addresses, so a write never changes an object and two workers writing
    the same key write the same bytes. ``max_bytes`` / ``max_age_s`` bound the store: every
    ``prune_every`` writes, objects older than ``max_age_s`` go, then the oldest until the
    rest fit (age is the object's modification time: object stores do not record reads).
    """

    def __init__(
        self,
        url: str,
        *,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        prune_every: int = 256,
        **storage_options: Any,
    ):
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        self._local = isinstance(self.fs, LocalFileSystem)  # a folder: writes need a rename
        self.root = self.root.rstrip("/")
        self.url = url
        self.max_bytes, self.max_age_s, self.prune_every = max_bytes, max_age_s, prune_every
        self._writes = 0
        self._lock = threading.Lock()

    def _path(self, key: str) -> str:
        digest = _digest(key)
        return f"{self.root}/{digest[:2]}/{digest}"

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self.fs.exists(path):
            return
        if self._local:
            # a local folder: write aside and rename, so no reader sees half a file
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        else:  # object stores write an object whole or not at all
            self.fs.pipe_file(path, data)
        self._count_write()

    def get(self, key: str) -> bytes | None:
        try:
            data: bytes = self.fs.cat_file(self._path(key))  # fsspec is untyped: the bytes
            return data
        except FileNotFoundError:
            return None

    def _modified(self, info: dict[str, Any]) -> float:
        for field in ("mtime", "LastModified", "updated", "last_modified", "created"):
            value = info.get(field)
            if value is None:
                continue
            if hasattr(value, "timestamp"):
                stamp: float = value.timestamp()  # a datetime (or pandas Timestamp)
                return stamp
            if isinstance(value, (int, float)):
                return float(value)
            try:
                from datetime import datetime

                return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
        return time.time()  # unknown: treated as new

    def prune(self, *, max_bytes: int | None = None, max_age_s: float | None = None) -> int:
        """Remove objects older than ``max_age_s``, then the oldest until under ``max_bytes``."""
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return 0
        entries = sorted(
            (self._modified(info), int(info.get("size") or 0), path)
            for path, info in found.items()
            if ".tmp-" not in path.rsplit("/", 1)[-1]
        )
        return _prune_oldest(entries, max_bytes, max_age_s, self.fs.rm_file)


class PostgresBlobs(_Pruned):
    """Blobs in a Postgres table (``speceyes_blobs`` by default): for deployments whose
    checkpoints already live in Postgres, so every worker that sees a thread sees its images.

    A pool of connections (``psycopg_pool``) serves the graph's threads. Reads refresh a
    blob's ``used_at`` at most once a minute; ``max_bytes`` / ``max_age_s`` bound the table
    (every ``prune_every`` writes, or call :meth:`prune` from a scheduled job). Images are
    stored once per content address however many threads and workers write them.
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "speceyes_blobs",
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        prune_every: int = 256,
        pool_size: int = 8,
    ):
        from psycopg_pool import ConnectionPool

        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        self.table = table
        self.max_bytes, self.max_age_s, self.prune_every = max_bytes, max_age_s, prune_every
        self._writes = 0
        self._lock = threading.Lock()
        self.pool = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, kwargs={"autocommit": True}, open=True
        )
        with self.pool.connection() as conn, conn.transaction():
            # workers starting together: one creates the table, the others wait and see it
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (table,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " key text PRIMARY KEY, data bytea NOT NULL, size integer NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT now(),"
                " used_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute(f"CREATE INDEX IF NOT EXISTS {table}_used_at ON {table} (used_at)")

    def put(self, key: str, data: bytes) -> None:
        _digest(key)
        with self.pool.connection() as conn:
            cur = conn.execute(
                f"INSERT INTO {self.table} (key, data, size) VALUES (%s, %s, %s)"
                " ON CONFLICT (key) DO UPDATE SET used_at = now()"
                f" WHERE {self.table}.used_at < now() - interval '60 seconds'",
                (key, data, len(data)),
            )
        if cur.rowcount:
            self._count_write()

    def get(self, key: str) -> bytes | None:
        _digest(key)
        with self.pool.connection() as conn:
            row = conn.execute(
                f"SELECT data, used_at < now() - interval '60 seconds' FROM {self.table}"
                " WHERE key = %s",
                (key,),
            ).fetchone()
            if row is None:
                return None
            if row[1]:
                conn.execute(f"UPDATE {self.table} SET used_at = now() WHERE key = %s", (key,))
        return bytes(row[0])

    def discard(self, key: str) -> None:
        with self.pool.connection() as conn:
            conn.execute(f"DELETE FROM {self.table} WHERE key = %s", (key,))

    def prune(self, *, max_bytes: int | None = None, max_age_s: float | None = None) -> int:
        """Remove blobs unused for ``max_age_s``, then the least recently used until the
        table holds at most ``max_bytes``."""
        removed = 0
        with self.pool.connection() as conn:
            if max_age_s is not None:
                cur = conn.execute(
                    f"DELETE FROM {self.table} WHERE used_at < now() - make_interval(secs => %s)",
                    (float(max_age_s),),
                )
                removed += cur.rowcount
            if max_bytes is not None:
                cur = conn.execute(
                    f"DELETE FROM {self.table} WHERE key IN (SELECT key FROM (SELECT key,"
                    " sum(size) OVER (ORDER BY used_at DESC, key) AS kept"
                    f" FROM {self.table}) newest WHERE kept > %s)",
                    (int(max_bytes),),
                )
                removed += cur.rowcount
        return removed

    @property
    def nbytes(self) -> int:
        with self.pool.connection() as conn:
            row = conn.execute(f"SELECT coalesce(sum(size), 0) FROM {self.table}").fetchone()
            assert row is not None  # an aggregate without GROUP BY always returns one row
            return int(row[0])

    def close(self) -> None:
        self.pool.close()


def blobs_from_url(url: str, **options: Any) -> BlobStore:
    """The blob store a URL names: ``memory`` (this process), a folder path or ``file://``
    (:class:`DirectoryBlobs`), ``postgresql://...`` (:class:`PostgresBlobs`), any other
    fsspec URL such as ``s3://bucket/prefix`` (:class:`FsspecBlobs`). ``options`` go to the
    store (``max_bytes``, ``max_age_s``, ...)."""
    if url in ("memory", "memory:"):
        return MemoryBlobs(options.get("max_bytes") or 512 * 2**20)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgres", "postgresql"):
        return PostgresBlobs(url, **options)
    if scheme in ("", "file"):
        path = url[len("file://") :] if scheme else url
        return DirectoryBlobs(path, **options)
    return FsspecBlobs(url, **options)
