"""The image store's parts: blobs, views that survive eviction, held images, deadlines."""

import contextvars
import os
import threading
import time

import pytest
from conftest import write_scene

from speceyes_graph.models import BatchScheduler
from speceyes_tools import DeadlineExceeded, DirectoryBlobs, ImageStore, MemoryBlobs, ResizeSpec
from speceyes_tools.blobs import blob_key
from speceyes_tools.deadlines import call_with_deadline, deadline_scope, time_left
from speceyes_tools.images import put_bytes, release


def test_memory_blobs_are_a_bounded_lru():
    blobs = MemoryBlobs(max_bytes=25)
    keys = [blob_key(bytes([i]) * 10) for i in range(5)]
    for i, key in enumerate(keys):
        blobs.put(key, bytes([i]) * 10)
    assert blobs.nbytes <= 25 and len(blobs) == 2 and blobs.get(keys[0]) is None
    assert blobs.get(keys[4]) == bytes([4]) * 10


def test_directory_blobs_outlive_the_store_and_prune(tmp_path, scene):
    first = ImageStore(blobs=DirectoryBlobs(tmp_path / "blobs"))
    key = first.put(open(scene, "rb").read())
    # another store on the same folder (another process, a server restart) reads it
    second = ImageStore(blobs=DirectoryBlobs(tmp_path / "blobs"))
    assert second.get(key).shape == (720, 1280, 3)
    assert not list((tmp_path / "blobs").rglob(".tmp-*"))  # written atomically
    other = first.put(b"x" * 100)
    removed = DirectoryBlobs(tmp_path / "blobs").prune(max_bytes=150)
    assert removed == 1 and second.blobs.get(other) is not None  # the oldest went first
    with pytest.raises(KeyError):
        DirectoryBlobs(tmp_path / "blobs").get("blob://../../etc/passwd")


def test_a_model_view_evicted_from_the_blobs_is_rendered_again(tmp_path):
    store = ImageStore(blobs=MemoryBlobs(max_bytes=10))  # keeps one blob at most
    a = write_scene(tmp_path / "a.png")
    key = store.model_view(a, ResizeSpec())
    store.model_view(write_scene(tmp_path / "b.png", colour=(0, 0, 200)), ResizeSpec())
    assert store.blobs.get(key) is None  # evicted
    data = store.read(key)  # still readable: rebuilt from its source
    assert data.startswith(b"\x89PNG") and store.model_view(a, ResizeSpec()) == key


def test_the_process_image_memory_is_sized_by_the_environment():
    """A deployment sizes the shared image memory without code (read at first use); a bound
    that is not a byte count fails naming the variable."""
    import subprocess
    import sys

    probe = "from speceyes_tools.memory import image_memory; print(image_memory().max_bytes)"

    def run(value):
        env = {k: v for k, v in os.environ.items() if k != "SPECEYES_IMAGE_MEMORY_BYTES"}
        if value is not None:
            env["SPECEYES_IMAGE_MEMORY_BYTES"] = value
        return subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        )

    assert run(None).stdout.strip() == str(2 << 30)
    assert run("536_870_912").stdout.strip() == str(512 << 20)
    assert run("0").stdout.strip() == "0"
    for bad in ("2GiB", "-1"):
        failed = run(bad)
        assert failed.returncode != 0
        assert "SPECEYES_IMAGE_MEMORY_BYTES must be a whole number of bytes" in failed.stderr


def test_an_images_decoded_and_processed_copies_share_one_bound(tmp_path, monkeypatch):
    """The store's decoded pixels and a model's processed tensors are held under one bound
    (the process's image memory): an image's two copies fit, two images' do not, so the
    least recently used copies go, whichever cache holds them."""
    import numpy as np
    import torch

    from speceyes_graph.models.image_cache import CachedImageProcessor, image_keys
    from speceyes_tools import memory

    decoded = 1280 * 720 * 3
    processed = 4 * decoded  # float32
    shared = memory.ImageMemory(decoded + processed + decoded // 2)
    monkeypatch.setattr(memory, "_process_memory", shared)
    store = ImageStore()
    processor = CachedImageProcessor(
        lambda images, **kw: {"pixel_values": torch.from_numpy(np.stack(images)).float()}
    )
    paths = [write_scene(tmp_path / f"{i}.png", colour=(0, 0, 50 * i)) for i in range(2)]
    for path in paths:
        with image_keys([path]):
            processor([store.get(path)], return_tensors="pt")
        assert shared.nbytes <= shared.max_bytes
    assert shared.nbytes == decoded + processed  # the second image's copies, both kept
    assert store.has_decoded([paths[1]]) and not store.has_decoded([paths[0]])
    with image_keys([paths[1]]):
        processor([store.get(paths[1])], return_tensors="pt")
    assert processor.hits == 1 and store.cache.decodes == 2


def test_a_held_image_stays_until_its_last_release(scene):
    data = open(scene, "rb").read()
    one, two = put_bytes(data), put_bytes(data)  # two queries, one image
    assert one == two
    release(one)
    from speceyes_tools import default_store

    assert default_store().get(two).shape == (720, 1280, 3)
    release(two)
    with pytest.raises(Exception, match="not in this image store"):
        default_store().get(two)


def test_call_with_deadline_keeps_context_and_errors():
    var = contextvars.ContextVar("v", default="unset")
    var.set("caller")
    assert call_with_deadline(lambda: var.get(), timeout=5, what="call") == "caller"

    def boom():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        call_with_deadline(boom, timeout=5, what="x")
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded, match="model call took longer than 0.2 s"):
        call_with_deadline(time.sleep, 5, timeout=0.2, what="model call")
    assert time.perf_counter() - t0 < 2
    with deadline_scope(time.time() + 0.2):
        assert 0 < time_left() <= 0.2 and time_left(0.1) == 0.1
        with pytest.raises(DeadlineExceeded, match="the query's deadline passed during the x"):
            call_with_deadline(time.sleep, 5, timeout=10, what="x")


def test_scheduler_drops_requests_whose_deadline_passed():
    started = threading.Event()
    release_worker = threading.Event()
    ran = []

    def run_batch(key, payloads):
        ran.extend(payloads)
        started.set()
        release_worker.wait(5)
        return payloads

    scheduler = BatchScheduler(run_batch, max_batch_size=1, max_wait_s=0)
    first = scheduler.submit("k", "first")  # occupies the worker
    started.wait(5)
    with deadline_scope(time.time() + 0.2), pytest.raises(DeadlineExceeded):
        scheduler.call("k", "late")  # waits behind it, then gives up
    release_worker.set()
    assert first.result(5) == "first"
    time.sleep(0.1)
    assert ran == ["first"]  # the abandoned request never ran
    scheduler.close()
