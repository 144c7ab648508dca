"""Deadlines and limits: each bad query fails alone, promptly, with a clear recorded error,
and the good queries of the same batch get the answers they get alone."""

import os
import threading
import time
import zlib

import pytest
from conftest import write_scene

from helpers import deepeyes_agent, judge, question_of, speculator
from speceyes_graph import Limits, LoopOptions, create_speceyes_graph
from speceyes_graph.models import ScriptedChatModel
from speceyes_tools import ImagePolicy, ImageStore
from speceyes_tools.codec import read_header

GOOD = {"question": "big?", "options": ["red", "blue"]}


def build(**kw):
    models = {
        "judge": judge(lambda q: "no" if "big" in q else "yes"),
        "speculator": speculator("A", 9.0),
        "agent": deepeyes_agent(answer="B"),
    }
    models.update({k: kw.pop(k) for k in list(kw) if k in models})
    return create_speceyes_graph(**models, **kw).compile()


def batch(graph, inputs, **config):
    t0 = time.perf_counter()
    outs = graph.batch(inputs, {"max_concurrency": len(inputs), **config})
    return outs, time.perf_counter() - t0


def assert_good(outs, indices):
    for i in indices:
        assert outs[i]["error"] is None and outs[i]["route"] == "speculative", outs[i]
        assert outs[i]["answer"] == "A"


def test_a_hung_model_call_fails_only_its_query(scene):
    release = threading.Event()

    def judge_rule(msgs):
        if "hang" in question_of(msgs):
            release.wait(60)  # a server that never answers
        return "no"

    g = build(judge=ScriptedChatModel(respond=judge_rule), limits=Limits(model_timeout_s=0.5))
    inputs = [
        {**GOOD, "images": [scene]},
        {"question": "hang?", "images": [scene]},
        {**GOOD, "images": [scene]},
    ]
    try:
        outs, took = batch(g, inputs)
    finally:
        release.set()
    assert took < 20  # the batch returns at the model deadline, not when the server answers
    assert outs[1]["error"].startswith("judge: DeadlineExceeded") and "0.5 s" in outs[1]["error"]
    assert_good(outs, [0, 2])


def test_the_query_deadline_bounds_a_slow_agent_loop(scene):
    def slow_agent(msgs):
        time.sleep(0.15)
        call = '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 100, 100]}}'
        return f"<tool_call>{call}</tool_call>"  # never answers

    g = build(
        agent=ScriptedChatModel(respond=slow_agent),
        limits=Limits(query_timeout_s=1.0),
        loop=LoopOptions(max_steps=30),
    )
    outs, took = batch(g, [{"question": "tiny?", "images": [scene]}, {**GOOD, "images": [scene]}])
    slow = outs[0]
    assert slow["stop_reason"] == "deadline" and "deadline" in slow["error"]
    assert 1 <= len(slow["agent_steps"]) < 30 and took < 15
    assert_good(outs, [1])


def test_a_fifo_is_refused_without_blocking(scene, tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # opening it for reading would block forever without a writer
    outs, took = batch(build(), [{**GOOD, "images": [str(fifo)]}, {**GOOD, "images": [scene]}])
    assert "not a regular file" in outs[0]["error"] and took < 10
    assert_good(outs, [1])


def test_fetches_have_a_total_deadline_and_a_byte_cap(scene, image_server):
    store = ImageStore(policy=ImagePolicy(fetch_timeout_s=1.0, max_bytes=1 << 20))
    g = build(store=store)
    inputs = [
        {**GOOD, "images": [image_server.url("/image.png")]},
        {**GOOD, "images": [image_server.url("/trickle")]},  # a byte every 0.2 s
        {**GOOD, "images": [image_server.url("/endless")]},  # 300 MB, no length
        {**GOOD, "images": [scene]},
    ]
    outs, took = batch(g, inputs)
    assert took < 15
    assert "took longer than the time allowed" in outs[1]["error"]
    assert "larger than the 1 MiB limit" in outs[2]["error"]
    assert_good(outs, [0, 3])


def big_png(path, side=12000):
    """A real PNG of side x side black pixels, a few hundred KB on disk (432 MB decoded)."""
    import struct

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    z = zlib.compressobj(9)
    row = b"\0" + b"\0" * (3 * side)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return str(path)


def price(path) -> int:
    """What the store's budget counts for one decode: the header's price and the file."""
    data = open(path, "rb").read()
    return read_header(data).decode_bytes + len(data)


def test_a_pixel_bomb_is_refused_before_decoding(scene, tmp_path):
    bomb = big_png(tmp_path / "bomb.png")
    assert os.path.getsize(bomb) < 1_000_000
    store = ImageStore()
    outs, _ = batch(
        build(store=store), [{**GOOD, "images": [bomb]}] * 3 + [{**GOOD, "images": [scene]}]
    )
    for out in outs[:3]:
        assert "12000x12000 (144.0 MP); the limit is 64 MP" in out["error"]
    assert_good(outs, [3])
    assert store.cache.budget.peak <= price(scene)  # only the scene was decoded


def test_decodes_in_flight_stay_within_the_memory_budget(tmp_path):
    paths = [
        write_scene(tmp_path / f"s{i}.png", size=(1000, 800), box=(10 * i, 10, 10 * i + 50, 60))
        for i in range(8)
    ]
    one = max(price(p) for p in paths)
    store = ImageStore(max_decode_bytes=int(2.5 * one))
    outs, _ = batch(build(store=store), [{**GOOD, "images": [p]} for p in paths])
    assert_good(outs, range(8))
    budget = store.cache.budget
    assert one <= budget.peak <= budget.limit and budget.in_use == 0


def test_a_long_question_is_refused_before_any_model_call(scene):
    j = judge("no")
    g = build(judge=j, limits=Limits(max_question_tokens=200))
    long_question = "big? " + "Describe every detail. " * 100
    outs, _ = batch(
        g, [{"question": long_question, "images": [scene]}, {**GOOD, "images": [scene]}]
    )
    assert "tokens long; this deployment accepts at most 200" in outs[0]["error"]
    assert j.calls == 1  # only the good query reached the judge
    assert_good(outs, [1])


def test_too_many_images_or_options(scene):
    g = build(limits=Limits(max_images=2))
    outs = g.batch(
        [
            {**GOOD, "images": [scene] * 3},
            {"question": "big?", "images": [scene], "options": [str(i) for i in range(27)]},
            {"question": "big?", "images": [scene], "options": [str(i) for i in range(26)]},
        ]
    )
    assert "'images' has 3 items; at most 2" in outs[0]["error"]
    assert "'options' has 27 items; at most 26" in outs[1]["error"]
    assert outs[2]["error"] is None  # A..Z


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"images": "scene.png"}, "'images' must be a list, got str (wrap it"),
        ({"options": "red"}, "'options' must be a list, got str"),
        ({"options": [["red"]]}, "option 0 must be a string"),
        ({"question": 42}, "'question' must be a non-empty string"),
        ({"question": "   "}, "'question' must be a non-empty string"),
        ({"images": [None]}, "an image reference must be a non-empty string"),
        ({"images": ["ftp://host/x.png"]}, "unsupported image reference"),
        ({"query_id": {"a": 1}}, "'query_id' must be a string"),
        ({"question": "What \ud800 is it?"}, "'question' is not valid text: character 5 is"),
        ({"options": ["red", "bl\udc80ue"]}, "'options[1]' is not valid text: character 2"),
        ({"images": ["/tmp/\ud83d.png"]}, "'images[0]' is not valid text"),
        ({"query_id": "q\udfff"}, "'query_id' is not valid text"),
    ],
)
def test_malformed_inputs_are_clear_errors(scene, bad, message):
    out = build().invoke({**GOOD, "images": [scene], **bad})
    assert out["error"].startswith("input: ") and message in out["error"], out["error"]
    assert out["answer"] is None and out["route"] is None


def test_tiny_model_context_caps_the_question(tiny_chat, tmp_path):
    """With real checkpoints: the cap is counted in the model's own tokens, against its
    4096-token context, and the good queries of the batch answer as they do alone."""
    small, large = tiny_chat["small"], tiny_chat["large"]
    assert large.context_length == 4096
    assert large.count_tokens("x" * 10_000) > 3072
    g = create_speceyes_graph(
        speculator=small, agent=large, loop=LoopOptions(max_steps=2)
    ).compile()
    scenes = [
        write_scene(tmp_path / f"q{i}.png", size=(320, 240), box=(20 * i, 20, 20 * i + 60, 80))
        for i in range(3)
    ]
    good = [
        {"question": "What colour is it?", "images": [s], "options": ["red", "blue"]}
        for s in scenes
    ]
    alone = g.batch(good)
    long = {"question": "x" * 10_000, "images": [scenes[0]]}
    surrogate = {"question": "What colour is \ud83d?", "images": [scenes[1]]}  # half an emoji
    mixed = g.batch([*good[:2], long, surrogate, good[2]])
    assert "3072" in mixed[2]["error"] and "tokens long" in mixed[2]["error"]
    assert mixed[3]["error"].startswith("input: QueryError: 'question' is not valid text")
    for a, b in zip(alone, [mixed[0], mixed[1], mixed[4]]):
        assert (a["route"], a["answer"], a["error"]) == (b["route"], b["answer"], b["error"])


def test_local_models_honour_the_model_deadline_without_a_thread(tiny_models, scene):
    """ChatTransformersVLM bounds its own wait for a batch (no extra thread per call) and
    drops a request whose deadline passed before it ran."""
    from speceyes_graph.models import ChatTransformersVLM

    slow = ChatTransformersVLM(model=str(tiny_models["large"]), max_new_tokens=64, max_wait_ms=300)
    g = create_speceyes_graph(
        judge=slow,
        speculator=speculator(),
        agent=deepeyes_agent(),
        limits=Limits(model_timeout_s=0.05),  # shorter than the batcher's 300 ms wait
    ).compile()
    out = g.invoke({"question": "big?", "images": [scene]})
    assert out["error"].startswith("judge: DeadlineExceeded")
    assert slow.scheduler.stats.requests == 0  # the abandoned request never ran
