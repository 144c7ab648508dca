"""Image references, decoding once per query, and the resize the model sees.

Graph state carries *references*, never pixels: a path, a ``file://``, ``data:`` or
``http(s)://`` URL from the caller, or a ``blob://<sha256>`` key of bytes the store holds
(a fetched or ``data:`` input, a zoomed crop, the image as a model sees it). A checkpoint
therefore stores a few dozen bytes per image.

:class:`ImageStore` is the one place references become pixels:

- :meth:`~ImageStore.intern` turns a caller's reference into a stable one under the store's
  :class:`~speceyes_tools.sources.ImagePolicy` (``data:`` and URLs are read once and kept
  as blobs; paths are checked and resolved);
- :meth:`~ImageStore.get` names the image by content (blob keys) or by (path, size, mtime)
  for files, so a file rewritten under the same name is read again, and hands the key to
  its :class:`~speceyes_tools.decode_cache.DecodeCache`, which decodes once, keeps arrays in
  an LRU bounded by bytes (by default the process's
  :func:`~speceyes_tools.memory.image_memory`, shared with local models' processed images)
  and meters decodes against a pixel cap and a memory budget; the decode itself
  (:mod:`speceyes_tools.codec`) is the one rule every path shares: first frame, upright,
  8-bit RGB;
- :meth:`~ImageStore.model_view` gives the blob key of the image as a model sees it (smart
  resize), which messages in state carry and which is turned into bytes only when a model
  is called (:meth:`~ImageStore.base64`).

References and views stay together here because each needs the other: a view is rendered
from a reference's pixels, and a view's key is itself a reference whose bytes may not exist
until it is read (:meth:`~ImageStore.read` encodes it then).

Corrupt, truncated, oversized or refused images raise :class:`ImageLoadError`, which the
graph records as that query's error.
"""

from __future__ import annotations

import base64
import contextvars
import functools
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
from cachetools import FIFOCache, LRUCache

from .blobs import BLOB_SCHEME, BlobStore, MemoryBlobs, blob_key, is_blob_key
from .codec import (
    ImageHeader,
    decode_image,
    encode_image,
    encode_png,
    exif_orientation,
    read_header,
    sniff_mime,
    upright,
)
from .deadlines import EarliestDeadlineFirst, cpu_work
from .decode_cache import DecodeCache
from .frames import ResizeSpec, smart_resize
from .memory import ImageMemory, image_memory
from .sources import (
    FileInfo,
    ImageLoadError,
    ImagePolicy,
    ImagePolicyError,
    _file_path,
    fetch_url,
    read_data_url,
    read_file,
    redact,
    resolve_file,
    stat_file,
)

__all__ = [
    "ImageHeader",
    "ImageLoadError",
    "ImagePolicy",
    "ImagePolicyError",
    "ImageStore",
    "ResizeSpec",
    "decode_image",
    "default_store",
    "encode_image",
    "encode_png",
    "exif_orientation",
    "load_image",
    "pixel_key",
    "current_store",
    "put_bytes",
    "read_header",
    "release",
    "smart_resize",
    "sniff_mime",
    "store_scope",
    "upright",
]


def pixel_key(arr: np.ndarray) -> str:
    """A ``blob://`` key naming an RGB array by its pixels (SHA-256 of its shape and bytes):
    like a blob key, it always means the same pixels and cannot be guessed without them, but
    needs no PNG encode (a few ms per megapixel instead of tens)."""
    h, w = arr.shape[:2]
    digest = hashlib.sha256(f"rgb8:{w}x{h}:".encode())
    digest.update(np.ascontiguousarray(arr).data.cast("B"))
    return BLOB_SCHEME + digest.hexdigest()


def _kind(ref: Any) -> str:
    """blob, data, url or file; anything else is refused here."""
    if not isinstance(ref, str) or not ref.strip():
        raise ImageLoadError(f"an image reference must be a non-empty string, got {ref!r:.80}")
    if is_blob_key(ref):
        return "blob"
    scheme = ref.split(":", 1)[0].lower() if "://" in ref or ref.startswith("data:") else ""
    if scheme == "data":
        return "data"
    if scheme in ("http", "https"):
        return "url"
    if scheme in ("", "file"):
        return "file"
    raise ImageLoadError(
        f"unsupported image reference {redact(ref)}: use a data: or http(s) URL, a path, or a "
        "blob:// key"
    )


def load_image(ref: str, policy: ImagePolicy | None = None) -> np.ndarray:
    """Decode one reference (no caching) under ``policy`` (default: local use)."""
    return ImageStore(policy=policy, max_bytes=0).get(ref)


# --- the store -----------------------------------------------------------------------------


@functools.cache
def _blob_writer() -> ThreadPoolExecutor:
    """The threads that write blobs put in the background (shared by every store)."""
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="speceyes-blob-write")


class ImageStore:
    """References in, pixels out: policy checks, blobs, model views, and (held in
    :attr:`cache`) decoded arrays under a memory bound.

    Args:
        max_bytes: decoded arrays kept (LRU), views' pixels included. None (the default):
            the process's :func:`~speceyes_tools.memory.image_memory` (2 GiB, or
            ``SPECEYES_IMAGE_MEMORY_BYTES``), shared with local models' processed images,
            so that all host copies of an image have one bound; a number: a bound of this
            store's own.
        policy: which references are opened (:class:`ImagePolicy`; default: local use).
        blobs: where blob bytes live (default: :class:`~speceyes_tools.blobs.MemoryBlobs`,
            512 MiB); use :class:`~speceyes_tools.blobs.DirectoryBlobs` for servers.
        max_decode_bytes: decodes in flight at once, in bytes (file plus pixels); more wait.
        workers: decodes and resizes running at once (default: the process-wide
            :func:`~speceyes_tools.deadlines.cpu_work` gate, a slot per CPU but one, shared
            with model request preparation); waiting ones go earliest deadline first, so a batch's first
            queries are ready first.
    """

    max_views = 4096  # views, and resolved file references, remembered

    def __init__(
        self,
        max_bytes: int | None = None,
        *,
        policy: ImagePolicy | None = None,
        blobs: BlobStore | None = None,
        max_decode_bytes: int = 1 << 30,
        workers: int | None = None,
    ):
        self.policy = policy or ImagePolicy()
        self.blobs: BlobStore = blobs if blobs is not None else MemoryBlobs()
        self._work = EarliestDeadlineFirst(workers) if workers else cpu_work()
        # originals under their source keys, views under their blob keys: one memory bound
        memory = image_memory() if max_bytes is None else ImageMemory(max_bytes)
        self.cache = DecodeCache(memory, max_decode_bytes=max_decode_bytes, work=self._work)
        # views are encoded on demand when nothing outside this process can read the blobs
        self.lazy_views = isinstance(self.blobs, MemoryBlobs)
        self._lock = threading.Lock()  # guards the tables below; the cache has its own
        # (source key, resize) -> blob key, and the view key -> how to render it: (reference,
        # resize, source key); a view used is kept in both
        self._views: LRUCache[tuple[Any, ResizeSpec | None], str] = LRUCache(self.max_views)
        self._derived: LRUCache[str, tuple[str, ResizeSpec | None, Any]] = LRUCache(self.max_views)
        # file reference -> resolved: first in, first out, so a resolution is redone in time
        self._real_paths: FIFOCache[str, str] = FIFOCache(self.max_views)
        # blob key -> its background write (put(background=True)); gone once it succeeded
        self._writing: dict[str, Future[None]] = {}

    # --- references ----------------------------------------------------------------------

    def put(self, data: bytes, *, background: bool = False) -> str:
        """Keep encoded image bytes; returns their ``blob://`` key.

        ``background=True`` returns the key at once and writes the bytes in a background
        thread: for callers on an event loop (LangGraph taking a run's input), where waiting
        on the blob store's I/O would stall every other run. Reading the key waits for the
        write, and a failed write fails those reads with its error.
        """
        key = blob_key(data)
        if not background:
            self.blobs.put(key, data)
            self._writing.pop(key, None)
            return key
        writing = self._writing.get(key)
        if writing is None or (writing.done() and writing.exception() is not None):
            writing = _blob_writer().submit(self.blobs.put, key, data)
            self._writing[key] = writing
            writing.add_done_callback(functools.partial(self._written, key))
        return key

    def _written(self, key: str, write: Future[None]) -> None:
        if write.exception() is None and self._writing.get(key) is write:
            self._writing.pop(key, None)

    def put_array(self, arr: np.ndarray) -> str:
        """Keep an RGB array as PNG; returns its ``blob://`` key."""
        return self.put(encode_png(arr))

    def intern(self, ref: Any) -> str:
        """A caller's reference made stable and checked: ``data:`` and URLs become blob keys
        (read once, under the policy), paths are resolved and checked, blob keys must exist."""
        kind = _kind(ref)
        if kind == "blob":
            with self._lock:
                known = ref in self._derived
            if not known and ref not in self.cache:
                self.read(ref)  # raises if unknown
            return cast(str, ref)  # _kind made sure: a blob key is a str
        if kind == "data":
            return self.put(read_data_url(ref, self.policy))
        if kind == "url":
            return self.put(fetch_url(ref, self.policy))
        return self._resolve(ref).path

    def _resolve(self, ref: str) -> FileInfo:
        """A file reference checked against the policy and stat'ed. Its resolution (symlinks
        followed, roots checked: a path component at a time, the costliest lookup a query
        makes when models answer at once) is remembered per store; the file is stat'ed on
        every use, so a rewrite is a new image. A symlink re-pointed inside the allowed
        folders keeps its first target until the entry ages out (``max_views`` entries)."""
        with self._lock:
            real = self._real_paths.get(ref)
        if real is None:
            info = resolve_file(ref, self.policy)
            with self._lock:
                self._real_paths[ref] = self._real_paths[info.path] = info.path
            return info
        return stat_file(real, self.policy, ref)

    def read(self, key: str) -> bytes:
        """The bytes behind a blob key (a model view evicted from memory is rebuilt)."""
        writing = self._writing.get(key)
        if writing is not None:  # put in the background: wait for it to be stored
            try:
                writing.result()
            except Exception as exc:
                raise ImageLoadError(
                    f"image {key[: len(BLOB_SCHEME) + 12]}... could not be stored: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        data = self.blobs.get(key) if is_blob_key(key) else None
        if data is not None:
            return data
        with self._lock:
            derivation = self._derived.get(key)
        if derivation is not None:  # a view not encoded yet, or evicted: encode it now
            ref, resize, _ = derivation
            arr = self.cache.peek(key)
            data = encode_png(arr if arr is not None else self._view_array(ref, resize))
            self.blobs.put(key, data)
            return data
        if not is_blob_key(key):
            raise ImageLoadError(f"not a blob key: {redact(key)}")
        raise ImageLoadError(
            f"image {key[: len(BLOB_SCHEME) + 12]}... is not in this image store (evicted, or "
            "stored by another process: use DirectoryBlobs for threads that outlive a process; "
            "or the worker that took the image died before storing it: send it again)"
        )

    def encoded(self, ref: str) -> bytes:
        """The encoded bytes behind any reference, under the policy, without decoding them
        (a file is read, a URL or ``data:`` URL kept as a blob first)."""
        _, load = self._source(ref)
        return load()

    # --- pixels --------------------------------------------------------------------------

    def _source(self, ref: str) -> tuple[Any, Callable[[], bytes]]:
        """(cache key, loader) for a reference, applying the policy."""
        kind = _kind(ref)
        if kind == "file":
            info = self._resolve(ref)
            return info.cache_key, lambda: read_file(info, self.policy)
        key = ref if kind == "blob" else self.intern(ref)
        return key, lambda: self.read(key)

    def get(self, ref: str) -> np.ndarray:
        """The decoded RGB array of a reference (read-only, shared between threads)."""
        key, load = self._source(ref)
        return self.cache.get(key, load, ref, self.policy.max_pixels)

    def _decode(self, data: bytes, name: str) -> np.ndarray:  # uncached (benchmarks)
        return self.cache.decode(data, name, self.policy.max_pixels)

    def size(self, ref: str) -> tuple[int, int]:
        """(width, height) of the original image."""
        arr = self.get(ref)
        return arr.shape[1], arr.shape[0]

    def has_decoded(self, refs: Any) -> bool:
        """Whether every reference is decoded and held, so that interning and getting it are
        lookups: blob keys, and files this store has resolved before (one ``stat`` each).
        URLs and ``data:`` URLs never are (interning reads them); neither is anything
        malformed, so that it fails where the real call does."""
        try:
            keys = []
            for ref in refs:
                kind = _kind(ref)
                if kind == "file":
                    with self._lock:
                        if ref not in self._real_paths:
                            return False
                    keys.append(self._resolve(ref).cache_key)
                elif kind == "blob":
                    keys.append(ref)
                else:
                    return False
        except Exception:  # noqa: BLE001 - the real call reports it
            return False
        return self.cache.holds_all(keys)

    # --- what a model is shown -----------------------------------------------------------

    def model_view(self, ref: str, resize: ResizeSpec | None = None) -> str:
        """Blob key of the image as the model will see it (smart-resized PNG), cached.

        Sending the resized image (not the 8K original) keeps requests small and makes the
        model's pixel coordinates exactly the frame that ``ResizeSpec`` maps back from.
        """
        source = ref if is_blob_key(ref) else self._source(ref)[0]
        with self._lock:
            key = self._views.get((source, resize))
            if key is not None:
                self._derived.get(key)  # used: kept as long as the view
                return key
        return self._render_view(ref, resize, source)

    def has_views(self, refs: Sequence[str], resize: ResizeSpec | None) -> bool:
        """Whether :meth:`model_view` of every reference is a lookup now (its view in this
        frame made, and its pixels still held): then a prompt over them needs no worker
        thread. A file is resolved under the policy (a ``stat``); anything refused is
        False, to fail where the real call does."""
        try:
            sources = [ref if is_blob_key(ref) else self._source(ref)[0] for ref in refs]
        except Exception:  # noqa: BLE001 - the real call reports it
            return False
        with self._lock:
            keys = [self._views.get((source, resize)) for source in sources]
        return None not in keys and self.cache.holds_all(keys)

    def _view_array(self, ref: str, resize: ResizeSpec | None) -> np.ndarray:
        arr = self.get(ref)
        if resize is None:
            return arr
        h, w = arr.shape[:2]
        tw, th = resize.size(w, h)
        if (tw, th) == (w, h):
            return arr
        import cv2  # OpenCV on the cached array: no 4-byte PIL copy

        interp = cv2.INTER_AREA if tw * th < w * h else cv2.INTER_CUBIC
        with self._work("image resize"):
            return cv2.resize(arr, (tw, th), interpolation=interp)

    def _render_view(self, ref: str, resize: ResizeSpec | None, source: Any) -> str:
        """Key the view, keep its pixels for local models, and (for blob stores other than
        in-process memory) write its PNG now; in memory the PNG is written on first
        :meth:`read`, by which only a served model or a caller asking for bytes waits."""
        arr = self._view_array(ref, resize)
        if self.lazy_views:
            key = pixel_key(arr)
        else:
            with self._work("image encode"):
                key = self.put_array(arr)
        self.cache.keep(key, arr)  # a local model reads the view's pixels without a decode
        with self._lock:
            self._views[(source, resize)] = key
            self._derived[key] = (ref, resize, source)
        return key

    def base64(self, key: str) -> tuple[str, str]:
        """(base64 data, MIME type) of a blob, for a model call."""
        data = self.read(key)
        return base64.b64encode(data).decode("ascii"), sniff_mime(data)

    # --- letting go ----------------------------------------------------------------------

    def forget(self, ref: str) -> None:
        """Drop one reference's decoded array, views and (for blobs) bytes."""
        path = os.path.realpath(_file_path(ref)) if _kind(ref) == "file" else None

        def matches(key: Any) -> bool:
            return key == ref or (isinstance(key, tuple) and key[1] == path)

        self.cache.forget(matches)
        with self._lock:
            for view in [v for v in self._views if matches(v[0])]:
                self._derived.pop(self._views.pop(view), None)
        discard = getattr(self.blobs, "discard", None)
        if discard is not None and is_blob_key(ref):
            discard(ref)

    def clear(self) -> None:
        """Drop every decoded array, view and resolved path (and the blobs, where the blob
        store can be cleared); :attr:`decodes` restarts at 0."""
        self.cache.clear()
        with self._lock:
            self._views.clear()
            self._derived.clear()
            self._real_paths.clear()
        clear = getattr(self.blobs, "clear", None)
        if clear is not None:
            clear()


_DEFAULT_STORE = ImageStore()


def default_store() -> ImageStore:
    """The process-wide store used by the tools and graph nodes unless given another."""
    return _DEFAULT_STORE


_CURRENT: contextvars.ContextVar[ImageStore | None] = contextvars.ContextVar(
    "speceyes_image_store", default=None
)


def current_store() -> ImageStore:
    """The store that ``blob://`` references in a model call belong to: the one a graph
    set with :func:`store_scope`, else :func:`default_store`."""
    return _CURRENT.get() or _DEFAULT_STORE


@contextmanager
def store_scope(store: ImageStore) -> Iterator[ImageStore]:
    """Within the block, :func:`current_store` is ``store``: a graph hands a local model
    ``blob://`` references (no pixels copied or encoded) and the model resolves them here."""
    token = _CURRENT.set(store)
    try:
        yield store
    finally:
        _CURRENT.reset(token)


_HELD: dict[str, int] = {}
_HELD_LOCK = threading.Lock()


def put_bytes(data: bytes) -> str:
    """Keep encoded image bytes in the default store until :func:`release`; returns a
    ``blob://`` reference. Counted: the same image put twice needs two releases."""
    key = _DEFAULT_STORE.put(data)
    with _HELD_LOCK:
        _HELD[key] = _HELD.get(key, 0) + 1
    return key


def release(ref: str) -> None:
    """Let go of an image from :func:`put_bytes`; forgotten (with its decoded copies) when no
    one holds it any more (benchmark runners stream thousands, some sharing an image)."""
    with _HELD_LOCK:
        left = _HELD.get(ref, 1) - 1
        if left > 0:
            _HELD[ref] = left
            return
        _HELD.pop(ref, None)
    _DEFAULT_STORE.forget(ref)
