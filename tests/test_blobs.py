"""Blob backends: the same contract in memory, in a folder, on fsspec and in Postgres; the
shared ones are bounded by size and age, and safe to write from many threads at once."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from speceyes_tools import ImageLoadError, ImageStore
from speceyes_tools.blobs import (
    DirectoryBlobs,
    FsspecBlobs,
    MemoryBlobs,
    PostgresBlobs,
    blob_key,
    blobs_from_url,
)

# what several workers can share
SHARED = [
    "directory",
    "fsspec-memory",
    "fsspec-local",
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def _factory(kind, request, tmp_path):
    """A factory of one backend (extra arguments: bounds), closed at the end."""
    made = []

    def make(**bounds):
        if kind == "memory":
            blobs = MemoryBlobs(bounds.get("max_bytes") or 2**20)
        elif kind == "directory":
            blobs = DirectoryBlobs(tmp_path / "blobs", **bounds)
        elif kind == "fsspec-memory":
            blobs = FsspecBlobs(f"memory://speceyes-test/{tmp_path.name}", **bounds)
        elif kind == "fsspec-local":
            blobs = FsspecBlobs(f"file://{tmp_path}/fs", **bounds)
        else:
            blobs = PostgresBlobs(request.getfixturevalue("postgres_dsn"), **bounds)
        made.append(blobs)
        return blobs

    make.kind = kind
    yield make
    for blobs in made:
        getattr(blobs, "close", lambda: None)()


@pytest.fixture(params=["memory", *SHARED])
def make_blobs(request, tmp_path):
    yield from _factory(request.param, request, tmp_path)


@pytest.fixture(params=SHARED)
def make_shared(request, tmp_path):
    """Only the backends several processes can share (bounded by size and age)."""
    yield from _factory(request.param, request, tmp_path)


def test_put_get_is_content_addressed(make_blobs):
    blobs = make_blobs()
    data = os.urandom(3000)
    key = blob_key(data)
    assert blobs.get(key) is None
    blobs.put(key, data)
    blobs.put(key, data)  # a second write of the same key changes nothing
    assert blobs.get(key) == data
    with pytest.raises(KeyError, match="not a blob key"):
        blobs.put("blob://../../etc/passwd", b"x")


def test_many_threads_write_and_read_at_once(make_blobs):
    blobs = make_blobs()
    items = [os.urandom(500 + i) for i in range(64)]

    def round_trip(data):
        key = blob_key(data)
        blobs.put(key, data)
        return blobs.get(key) == data

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(round_trip, items + items))  # every item written twice, racing


def test_a_size_bound_keeps_the_newest(make_shared):
    blobs = make_shared(max_bytes=10_000, prune_every=1)
    keys = []
    for i in range(8):
        data = bytes([i]) * 3000
        keys.append(blob_key(data))
        blobs.put(keys[-1], data)
        time.sleep(0.02)  # distinct modification times
    present = [blobs.get(k) is not None for k in keys]
    assert present[-3:] == [True, True, True]  # the newest fit in 10 kB
    assert sum(present) <= 3 and not present[0]


def test_age_based_cleanup(make_shared):
    blobs = make_shared()
    old, new = b"o" * 100, b"n" * 100
    blobs.put(blob_key(old), old)
    time.sleep(1.2)
    blobs.put(blob_key(new), new)
    assert blobs.prune(max_age_s=1.0) == 1
    assert blobs.get(blob_key(old)) is None and blobs.get(blob_key(new)) == new


def test_an_image_store_over_each_backend(make_shared, scene):
    """The image store keeps its pasted inputs and views there: a second store over the same
    backend (another worker) reads them."""
    import base64

    blobs = make_shared()
    first, second = ImageStore(blobs=blobs), ImageStore(blobs=blobs)
    data_url = "data:image/png;base64," + base64.b64encode(open(scene, "rb").read()).decode()
    key = first.intern(data_url)
    view = first.model_view(key)
    assert second.get(key).shape == (720, 1280, 3)
    assert second.read(view)[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.postgres
def test_blobs_from_url(tmp_path, postgres_dsn):
    assert isinstance(blobs_from_url("memory"), MemoryBlobs)
    assert isinstance(blobs_from_url(str(tmp_path / "a")), DirectoryBlobs)
    assert isinstance(blobs_from_url(f"file://{tmp_path}/b", max_bytes=10), DirectoryBlobs)
    assert isinstance(blobs_from_url("memory://bucket/prefix"), FsspecBlobs)
    pg = blobs_from_url(postgres_dsn, max_age_s=3600)
    assert isinstance(pg, PostgresBlobs) and pg.max_age_s == 3600
    pg.close()
    with pytest.raises(ValueError, match="plain SQL identifier"):
        PostgresBlobs(postgres_dsn, table="blobs; DROP TABLE x")


class _Gated(MemoryBlobs):
    """Blobs whose writes wait for ``release`` (a slow disk), or fail (a full one)."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.release, self.fail = threading.Event(), fail

    def put(self, key: str, data: bytes) -> None:
        self.release.wait(10)
        if self.fail:
            raise OSError("no space left on device")
        super().put(key, data)


def test_a_background_put_returns_its_key_and_reads_wait_for_the_write(scene):
    """For callers on an event loop: the key at once, the write in a background thread; a
    read of the key waits for it, so nothing reads an image that is not stored yet."""
    data = open(scene, "rb").read()
    blobs = _Gated()
    store = ImageStore(blobs=blobs)
    key = store.put(data, background=True)
    assert key == blob_key(data) and blobs.get(key) is None  # not written yet
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(store.read, key)
        time.sleep(0.2)
        assert not reading.done()  # waiting for the write
        blobs.release.set()
        assert reading.result(10) == data
    assert store.get(key).shape[:2] == store.get(scene).shape[:2]


def test_a_failed_background_put_fails_the_reads_with_its_error(scene):
    blobs = _Gated(fail=True)
    blobs.release.set()
    store = ImageStore(blobs=blobs)
    key = store.put(open(scene, "rb").read(), background=True)
    with pytest.raises(ImageLoadError, match="could not be stored: OSError: no space left"):
        store.read(key)
    blobs.fail = False  # the same bytes put again: stored, and read
    assert store.put(open(scene, "rb").read(), background=True) == key
    assert store.read(key) == open(scene, "rb").read()
