"""Shared fixtures: synthetic images on disk and scripted models."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist each worker (and the servers and scripts it starts) computes on one
    # thread: two workers with a thread per core each, on two cores, made OpenMP's waiting
    # threads take turns with the other worker's and slowed some tests tenfold.
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

import numpy as np
import pytest
from PIL import Image

from speceyes_tools import default_store


@pytest.fixture(autouse=True)
def _fresh_image_cache():
    default_store().clear()
    yield
    default_store().clear()


def write_scene(path, size=(1280, 720), box=(100, 100, 200, 200), colour=(220, 30, 30)):
    """A light background with one coloured rectangle; returns the path as str."""
    arr = np.full((size[1], size[0], 3), 245, np.uint8)
    x1, y1, x2, y2 = box
    arr[y1:y2, x1:x2] = colour
    Image.fromarray(arr).save(path)
    return str(path)


@pytest.fixture
def scene(tmp_path):
    return write_scene(tmp_path / "scene.png")


@pytest.fixture
def gradient_image(tmp_path):
    """Pixel (x, y) = (x % 256, y % 256, (x // 256 + y // 256) % 256): every crop is checkable."""
    h, w = 1000, 1500
    ys, xs = np.mgrid[0:h, 0:w]
    arr = np.stack([xs % 256, ys % 256, (xs // 256 + ys // 256) % 256], axis=-1).astype(np.uint8)
    path = tmp_path / "gradient.png"
    Image.fromarray(arr).save(path)
    return str(path), arr


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny random Qwen3-VL (small) and Qwen2.5-VL (large) checkpoints, built offline."""
    from speceyes_graph.demo.tiny import make_tiny_models

    return make_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_families(tmp_path_factory):
    """Tiny random checkpoints of eleven image-text-to-text families (tests/test_families.py)."""
    from speceyes_graph.demo.tiny_families import FAMILIES, make_tiny_family

    root = tmp_path_factory.mktemp("tiny-families")
    return {family: make_tiny_family(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_chat(tiny_models):
    """ChatTransformersVLM instances over the tiny checkpoints (loaded once per session)."""
    from speceyes_graph.models import ChatTransformersVLM

    return {
        "small": ChatTransformersVLM(
            model=str(tiny_models["small"]), top_logprobs=16, max_new_tokens=6
        ),
        "large": ChatTransformersVLM(model=str(tiny_models["large"]), max_new_tokens=12),
    }


@pytest.fixture
def image_server(scene):
    """A loopback HTTP server serving the scene (and misbehaving on other paths)."""
    from image_server import ImageServer

    with open(scene, "rb") as f, ImageServer(f.read()) as server:
        yield server


@pytest.fixture(scope="session")
def demo_queries_60(tmp_path_factory):
    """The 60 held-out demo queries the engine tests run (a third need the zoom tool)."""
    from engine_parity import demo_inputs

    return demo_inputs(tmp_path_factory.mktemp("demo-scenes"))


@pytest.fixture(scope="session")
def demo_local():
    """The shipped demo checkpoints on the transformers path (the engines' reference)."""
    from speceyes_graph.demo import demo_models

    return demo_models()


TOOL_PARSER = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@pytest.fixture(scope="session")
def vllm_servers():
    """Real vLLM servers (``bash scripts/setup-vllm.sh``) for the shipped demo checkpoints,
    started once for the session on free loopback ports under names of their own (``small``,
    ``large``, as deployments name them) and stopped at its end. Tests that use them are
    marked ``vllm`` (deselect with -m "not vllm"). The tiny random checkpoints of
    ``tiny_models`` cannot be served: their head size (16) is below what vLLM's CPU attention
    supports; the demo checkpoints are tiny too (1.4M and 2.8M parameters)."""
    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.models.servers import VLLMServer

    paths = demo_checkpoints()
    yield from serve("vllm", [
        VLLMServer(paths["small"], name="small"),
        # native tool calls for the standard suites (the DeepEyes protocol sends none)
        VLLMServer(paths["large"], name="large", extra_args=TOOL_PARSER),
    ])  # fmt: skip


@pytest.fixture(scope="session")
def sglang_servers():
    """Real SGLang servers (``bash scripts/setup-sglang.sh``) for the demo checkpoints, served
    as ``small`` and ``large`` on a CPU; tests that use them are marked ``sglang``."""
    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.models.servers import SGLangServer

    paths = demo_checkpoints()
    yield from serve("sglang", [SGLangServer(paths[r], name=r) for r in ("small", "large")])


def serve(engine, servers):
    """Start the servers together, hand them over by name, and stop them afterwards."""
    from speceyes_graph.models.servers import EngineNotInstalled, start_servers

    try:
        start_servers(servers)
    except EngineNotInstalled as exc:
        pytest.fail(f"{exc} (or deselect these tests: -m 'not {engine}')")
    _RUNNING[f"{engine}_servers"] = servers  # stopped after their last test
    yield {s.name: s for s in servers}
    for s in servers:
        s.stop()
    assert all(s.process is None for s in servers)


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server for the session (``tests/postgres_server.py``), in a
    folder of its own under the system temp dir (the server's user must reach it)."""
    import shutil
    import tempfile

    from postgres_server import PostgresServer, PostgresUnavailable

    root = tempfile.mkdtemp(prefix="speceyes-pg-")
    server = PostgresServer(root)
    try:
        server.start()
    except PostgresUnavailable as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(str(exc))
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres, request):
    """A fresh database on the session's server, for one test."""
    import re

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    name = f"t{len(_DATABASES)}_{name}"
    _DATABASES.append(name)
    return postgres.create_database(name)


_DATABASES: list[str] = []


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_store(request):
    """A LangGraph store several workers share: LangGraph's in-memory one, and PostgreSQL's
    (a fresh database per test)."""
    if request.param == "memory":
        from langgraph.store.memory import InMemoryStore

        yield InMemoryStore()
        return
    from langgraph.store.postgres import PostgresStore

    dsn = request.getfixturevalue("postgres_dsn")
    with PostgresStore.from_conn_string(dsn) as store:
        store.setup()
        yield store


# --- the engine tests: one engine's servers at a time, on one worker --------------------------
#
# A pair of engine servers holds about 5 GB and keeps a core busy while it starts, so the tests
# that use them run last, grouped by engine: first those on the session's vLLM servers, then the
# one that starts its own, then SGLang's; each pair is stopped after the last test that uses it
# instead of at the end of the session. Under pytest-xdist (``-n 2 --dist loadgroup``, as the
# README runs the suite) they all go to one worker, so each server starts once per session and
# the transformers runs they are compared with are computed once (``engine_parity``).

ENGINE_FIXTURES = ("vllm_servers", "sglang_servers")
_RUNNING: dict[str, list] = {}  # engine fixture -> its running servers
_LAST_USER: dict[str, str] = {}  # engine fixture -> node id of the last test that uses it


def _engine_block(item) -> int:
    """0: no engine; 1: the session's vLLM servers; 2: vLLM servers of its own; 3: SGLang;
    4: Aegra instances (each with the demo models in memory)."""
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("aegra"):
        return 4
    if "vllm_servers" in names:
        return 1
    if "sglang_servers" in names:
        return 3
    return 2 if item.get_closest_marker("vllm") or item.get_closest_marker("sglang") else 0


@pytest.hookimpl(tryfirst=True)  # before xdist names the group in the node ids
def pytest_collection_modifyitems(config, items):
    items.sort(key=_engine_block)  # stable: each block keeps the files' order
    for item in items:
        if _engine_block(item):
            item.add_marker(pytest.mark.xdist_group("engines"))


def pytest_collection_finish(session):
    _LAST_USER.clear()
    for item in session.items:  # what runs, after -k / -m
        for name in ENGINE_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                _LAST_USER[name] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    for name, nodeid in _LAST_USER.items():
        if item.nodeid == nodeid:
            for server in _RUNNING.pop(name, []):
                server.stop()


_SESSION_START = time.time()


def pytest_terminal_summary(terminalreporter):
    """Figures tests measured, in the CI log, when they ran: the image corpus's counts
    (tests/test_corpus.py), the chat server's time to the first answer
    (tests/test_chat_ui.py)."""
    root = Path(__file__).resolve().parent.parent
    for title, report in (
        ("image corpus", root / ".corpus" / "last-report.txt"),
        ("chat server: time to the first answer", root / "build" / "figures" / "chat-first-answer.txt"),
    ):  # fmt: skip
        if report.exists() and report.stat().st_mtime >= _SESSION_START:
            terminalreporter.write_sep("=", title)
            terminalreporter.write_line(report.read_text())
