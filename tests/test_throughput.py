"""Throughput features keep results exact: zero-copy images, the processed-image cache,
announced requests in the batch scheduler, parallel speculation.

Speed itself is measured by ``scripts/bench_throughput.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import numpy as np
import pytest
import torch
from langchain_core.messages import AIMessage
from PIL import Image

from helpers import question_of
from speceyes_graph import LoopOptions, create_speceyes_graph
from speceyes_graph.models import ChatTransformersVLM, ScriptedChatModel, fake_logprobs
from speceyes_graph.models.batching import BatchScheduler
from speceyes_graph.models.image_cache import CachedImageProcessor, image_keys
from speceyes_tools import ImageStore


def _image(tmp_path, name, w, h, seed):
    arr = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    path = tmp_path / name
    Image.fromarray(arr).save(path)
    return str(path), arr


# --- the processed-image cache ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["small", "large"])  # Qwen3-VL, Qwen2.5-VL processors
def test_cached_image_processing_equals_the_processor(tiny_chat, kind):
    processor = tiny_chat[kind].processor
    assert isinstance(processor.image_processor, CachedImageProcessor)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for w, h in ((300, 200), (97, 411))]
    text = [
        "<|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|image_pad|><|vision_end|>"
    ]
    plain = processor(text=text, images=images, return_tensors="pt")  # no keys: uncached
    cache = processor.image_processor
    hits = cache.hits
    for _ in range(2):  # a miss per image, then hits
        with image_keys(["blob://a", "blob://b"]):
            cached = processor(text=text, images=images, return_tensors="pt")
        assert set(cached) == set(plain)
        for name in plain:
            assert torch.equal(cached[name], plain[name]), name
    assert cache.hits - hits == 2


def test_image_cache_reuses_the_judge_image_on_the_first_agent_turn(tiny_models, scene):
    large = ChatTransformersVLM(model=str(tiny_models["large"]), max_new_tokens=4)
    small = ChatTransformersVLM(model=str(tiny_models["small"]), top_logprobs=8, max_new_tokens=4)
    judge = ScriptedChatModel(respond=lambda m: "yes")  # always to the agent loop
    graph = create_speceyes_graph(
        judge=judge, speculator=small, agent=large, loop=LoopOptions(max_steps=1)
    ).compile()
    cache = large.processor.image_processor
    before = cache.hits, cache.misses
    graph.invoke({"question": "What is it?", "images": [scene]})
    # judged by the scripted judge; the agent's only turn processes the image: one miss
    assert (cache.hits, cache.misses) == (before[0], before[1] + 1)
    # the large model judges, the draft has no log-probs (always rejected), so the agent's
    # first turn follows the judge on the same image: one miss (judge), then one hit (agent)
    no_scores = ScriptedChatModel(respond=lambda m: "A")
    graph2 = create_speceyes_graph(
        speculator=no_scores, agent=large, loop=LoopOptions(max_steps=1)
    ).compile()
    cache.clear()
    before = cache.hits, cache.misses
    out = graph2.invoke({"question": "What is it?", "images": [scene]})
    assert out["route"] in ("judged-agentic", "rejected-agentic") and len(out["agent_steps"]) == 1
    assert (cache.hits, cache.misses) == (before[0] + 1, before[1] + 1)


# --- zero-copy images -----------------------------------------------------------------------


def test_local_models_get_references_served_models_get_base64(tiny_chat, scene, monkeypatch):
    store = ImageStore()
    encoded = []
    original = ImageStore.base64

    def spy(self, key):
        encoded.append(key)
        return original(self, key)

    monkeypatch.setattr(ImageStore, "base64", spy)
    local = create_speceyes_graph(speculator=tiny_chat["small"], mode="small", store=store)
    out = local.compile().invoke({"question": "Colour?", "images": [scene]})
    assert out["error"] is None and out["draft"]["text"] is not None
    assert encoded == []  # the local model read the store's pixels: no base64 round trip

    served = ScriptedChatModel(
        respond=lambda m: AIMessage(
            content="A", response_metadata={"logprobs": fake_logprobs(["A"], [9.0])}
        )
    )
    graph = create_speceyes_graph(speculator=served, mode="small", store=store).compile()
    assert graph.invoke({"question": "Colour?", "images": [scene]})["answer"] == "A"
    assert len(encoded) == 1
    blocks = [b for b in served.received[-1][-1].content if b.get("type") == "image"]
    assert blocks and blocks[0]["base64"] and "url" not in blocks[0]


def test_a_model_view_needs_no_decode(tmp_path):
    store = ImageStore()
    path, _ = _image(tmp_path, "big.png", 900, 700, 1)
    from speceyes_tools import ResizeSpec

    key = store.model_view(path, ResizeSpec(max_pixels=200 * 200))
    decodes = store.cache.decodes
    view = store.get(key)
    assert store.cache.decodes == decodes  # the resized array was kept, not re-decoded from PNG
    from speceyes_tools.images import decode_image

    assert np.array_equal(view, decode_image(store.read(key)))  # and it is what the PNG holds


# --- the scheduler waits for announced requests --------------------------------------------


def echo_scheduler(sizes: list, **settings) -> BatchScheduler:
    """A scheduler whose batches return their payloads, recording each batch's size."""
    return BatchScheduler(
        lambda key, payloads: sizes.append(len(payloads)) or list(payloads), **settings
    )


def test_announced_requests_meet_in_one_batch():
    sizes = []
    scheduler = echo_scheduler(sizes, max_batch_size=8, max_wait_s=0.001, max_expect_s=5.0)
    scheduler.expect("k", 4)
    results = []

    def caller(i):
        time.sleep(0.05 * i)  # staggered, as requests prepared by different threads are
        results.append(scheduler.call("k", i))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes == [4] and sorted(results) == [0, 1, 2, 3]


def test_a_withdrawn_announcement_does_not_hold_a_batch():
    sizes = []
    scheduler = echo_scheduler(sizes, max_wait_s=0.001, max_expect_s=30.0)
    scheduler.expect("k", 2)
    scheduler.expect("k", -1)  # one of them failed while being prepared
    done = []
    t = threading.Thread(target=lambda: done.append(scheduler.call("k", "a")))
    t.start()
    t.join(timeout=10)  # would wait out max_expect_s (30 s) if the announcement stuck
    assert done == ["a"] and sizes == [1]
    scheduler.close()


def test_a_full_batch_of_another_key_is_not_held_up():
    order = []
    release = threading.Event()

    def run(key, payloads):
        order.append((key, len(payloads)))
        return list(payloads)

    scheduler = BatchScheduler(run, max_batch_size=2, max_wait_s=0.001, max_expect_s=30.0)
    scheduler.expect("judge", 5)  # announced, arriving slowly
    futures = [scheduler.submit("judge", 0)]
    futures += scheduler.submit_many("agent", [1, 2])  # a full batch of another key
    assert futures[1].result(timeout=10) == 1  # ran although the judge batch is still filling
    assert order[0] == ("agent", 2)
    scheduler.expect("judge", -4)
    assert futures[0].result(timeout=10) == 0
    release.set()
    scheduler.close()


# --- parallel speculation -------------------------------------------------------------------


class _Timed(ScriptedChatModel):
    """Scripted, slow, and recording when each call started and ended."""

    delay: float = 0.3
    spans: list = []

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        start = time.monotonic()
        time.sleep(self.delay if "tools" in question_of(messages) else 0.3)
        result = super()._generate(messages, stop, run_manager, **kwargs)
        self.spans.append((question_of(messages), start, time.monotonic()))
        return result


def _models():
    judge = _Timed(respond=lambda m: "no" if "free" in question_of(m) else "yes", spans=[])
    draft = _Timed(
        respond=lambda m: AIMessage(
            content="A",
            response_metadata={
                "logprobs": fake_logprobs(["A"], [9.0 if "certain" in question_of(m) else 4.0])
            },
        ),
        spans=[],
    )
    agent = ScriptedChatModel(respond=lambda m: "<answer>B</answer>")
    return judge, draft, agent


QUERIES = ["free and certain", "free but doubtful", "needs tools, certain"]


def test_parallel_speculation_drafts_while_the_judge_runs(scene):
    judge, draft, agent = _models()
    graph = create_speceyes_graph(
        judge=judge, speculator=draft, agent=agent, speculation="parallel"
    ).compile()
    outs = [graph.invoke({"question": q, "images": [scene]}) for q in QUERIES[:2]]
    assert [o["route"] for o in outs] == ["speculative", "rejected-agentic"]
    assert [o["answer"] for o in outs] == ["A", "B"]
    for (_, j0, j1), (_, d0, d1) in zip(judge.spans, draft.spans, strict=True):
        assert d0 < j1 and j0 < d1  # the draft ran during the judge, not after it
    assert all("discarded" not in o["draft"] for o in outs)


def test_the_agent_does_not_wait_for_a_moot_draft(scene):
    judge, draft, agent = _models()
    draft.delay = 1.5  # a slow draft for a query the judge sends to the agent
    graph = create_speceyes_graph(
        judge=judge, speculator=draft, agent=agent, speculation="parallel"
    ).compile()
    out = graph.invoke({"question": "needs tools, certain", "images": [scene]})
    finished = time.monotonic()
    assert out["route"] == "judged-agentic" and out["answer"] == "B"
    assert out["draft"]["discarded"] is True and out["draft"]["accepted"] is False
    assert "the judge asked for tools" in out["draft"]["note"]
    assert not draft.spans or draft.spans[0][2] > finished  # answered before the draft ended


def test_a_queued_moot_draft_never_reaches_the_model(tiny_models, scene):
    """A draft still waiting for its batch when the judge asks for tools is withdrawn."""
    small = ChatTransformersVLM(
        model=str(tiny_models["small"]), top_logprobs=8, max_new_tokens=4, max_wait_ms=5
    )
    judge = ScriptedChatModel(respond=lambda m: "yes")
    agent = ScriptedChatModel(respond=lambda m: "<answer>B</answer>")
    graph = create_speceyes_graph(
        judge=judge, speculator=small, agent=agent, speculation="parallel"
    ).compile()
    hold = threading.Event()
    original = small.scheduler.run_batch
    small.scheduler.run_batch = lambda key, payloads: hold.wait(10) and original(key, payloads)
    try:
        busy = small.scheduler.submit(("busy",), None)  # occupies the worker
        time.sleep(0.05)
        out = graph.invoke({"question": "Colour?", "images": [scene]})
    finally:
        hold.set()
        small.scheduler.run_batch = original
    busy.exception(timeout=10)
    assert out["route"] == "judged-agentic"
    assert "cancelled before it ran" in out["draft"]["note"]
    time.sleep(0.1)
    assert small.scheduler.stats.requests == 1  # only the busy request ever ran


def test_after_judge_drafts_only_tool_free_queries(scene):
    judge, draft, agent = _models()
    graph = create_speceyes_graph(judge=judge, speculator=draft, agent=agent).compile()
    outs = [graph.invoke({"question": q, "images": [scene]}) for q in QUERIES]
    assert [o["route"] for o in outs] == ["speculative", "rejected-agentic", "judged-agentic"]
    assert outs[2]["draft"] is None and len(draft.spans) == 2
    for (_, _, j1), (_, d0, _) in zip(judge.spans, draft.spans, strict=False):
        assert d0 >= j1  # sequential funnel


def test_a_discarded_draft_is_not_the_agents_fallback(scene):
    judge, draft, _ = _models()
    silent = ScriptedChatModel(respond=lambda m: "I cannot decide.")  # never answers
    graph = create_speceyes_graph(
        judge=judge,
        speculator=draft,
        agent=silent,
        speculation="parallel",
        loop=LoopOptions(max_steps=1),
    ).compile()
    out = graph.invoke({"question": "needs tools, certain", "images": [scene]})
    assert out["route"] == "judged-agentic" and out["answer"] is None
    assert out["stop_reason"] == "step_limit, no answer"  # as after_judge: no draft to fall to


def test_parallel_speculation_keeps_the_funnel(scene):
    judge, draft, agent = _models()
    graphs = [
        create_speceyes_graph(judge=judge, speculator=draft, agent=agent, speculation=s)
        for s in ("after_judge", "parallel")
    ]
    edges = [{(e.source, e.target) for e in g.compile().get_graph().edges} for g in graphs]
    assert edges[0] == edges[1]  # the same picture: only when the draft starts differs
    with pytest.raises(ValueError, match="speculation"):
        create_speceyes_graph(judge=judge, speculator=draft, agent=agent, speculation="eager")


# --- bit-identical to the sequential path ---------------------------------------------------


def _signature(out: dict) -> tuple:
    draft = out.get("draft") or {}
    kept = None if draft.get("discarded") else draft  # parallel speculation's extra draft
    return (
        out["route"],
        out["answer"],
        out["error"],
        out.get("judge_output"),
        (kept.get("text"), kept.get("score"), kept.get("token_scores")) if kept else None,
        [s["model_text"] for s in out.get("agent_steps") or []],
    )


def _three_ways(models: dict, inputs: list[dict], monkeypatch, **settings) -> list[list[tuple]]:
    """after_judge, parallel, and the old path (base64 images, no processed-image or
    vision-output cache)."""
    runs = []
    for speculation, refs in (("after_judge", True), ("parallel", True), ("after_judge", False)):
        monkeypatch.setattr(ChatTransformersVLM, "accepts_image_refs", refs)
        for m in models.values():
            base = m.hf_model.base_model
            processor, vision = m.processor.image_processor, base.get_image_features
            processor.clear()
            vision.clear()
            if not refs:  # the caches taken out (put back when the test ends)
                monkeypatch.setattr(m.processor, "image_processor", processor.inner)
                monkeypatch.setattr(base, "get_image_features", vision.encode)
        graph = create_speceyes_graph(
            speculator=models["small"], agent=models["large"], speculation=speculation, **settings
        ).compile()
        runs.append([_signature(o) for o in graph.batch(inputs, {"max_concurrency": 16})])
    return runs


def test_results_are_bit_identical_on_the_demo_models(tmp_path, monkeypatch):
    """Same answers, routes, judge outputs, draft scores and agent transcripts, exactly.

    One request per generate call: a batched call's scores also depend on which requests
    share it (padding), in the last bits, which varies from run to run on any path."""
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models, demo_queries

    models = demo_models(batch_size=1)
    queries = demo_queries(tmp_path, 8, seed=3)
    inputs = [{"question": q.question, "images": [q.image], "options": q.options} for q in queries]
    vision = models["large"].hf_model.base_model.get_image_features
    after, parallel, old = _three_ways(models, inputs, monkeypatch, **DEMO_GRAPH_SETTINGS)
    assert {s[0] for s in after} >= {"speculative", "judged-agentic"}
    assert vision.hits > 0  # the judge's image reused on the agent's turns
    assert parallel == after
    assert old == after


def test_results_are_bit_identical_on_the_tiny_models(tiny_models, scene, monkeypatch):
    models = {
        "small": ChatTransformersVLM(
            model=str(tiny_models["small"]), top_logprobs=16, max_new_tokens=6, max_batch_size=1
        ),
        "large": ChatTransformersVLM(
            model=str(tiny_models["large"]), max_new_tokens=8, max_batch_size=1
        ),
    }
    inputs = [{"question": f"What is shown? ({i})", "images": [scene]} for i in range(4)]
    after, parallel, old = _three_ways(
        models, inputs, monkeypatch, judge="speculator", loop=LoopOptions(max_steps=2)
    )
    assert parallel == after
    assert old == after


# --- requests of other settings ride along a batch -------------------------------------------


def test_shorter_requests_ride_along_a_longer_batch_never_the_reverse():
    batches = []
    release = threading.Event()

    def run(key, payloads):
        batches.append((key, list(payloads)))
        release.wait(10)
        return list(payloads)

    scheduler = BatchScheduler(
        run, max_batch_size=8, max_wait_s=0.01, can_join=lambda a, b: b[0] <= a[0]
    )
    blocker = scheduler.submit((1, "blocker"), "x")  # holds the worker while the rest queue
    time.sleep(0.05)
    agent = scheduler.submit_many((256, "agent"), ["a1", "a2"])
    judge = scheduler.submit_many((10, "judge"), ["j1"])
    release.set()
    for f in [blocker, *agent, *judge]:
        f.result(timeout=10)
    assert batches[1][1] == ["a1", "a2", "j1"]  # the judge call rode along the agent batch
    assert list(batches[1][0]) == [(256, "agent"), (256, "agent"), (10, "judge")]

    batches.clear()
    release.clear()
    blocker = scheduler.submit((1, "blocker"), "x")
    time.sleep(0.05)
    judge = scheduler.submit_many((10, "judge"), ["j2"])
    agent = scheduler.submit_many((256, "agent"), ["a3"])
    release.set()
    for f in [blocker, *agent, *judge]:
        f.result(timeout=10)
    assert [b[1] for b in batches[1:]] == [["j2"], ["a3"]]  # the longer one waits its turn
    scheduler.close()


def test_rows_with_their_own_lengths_and_stops_match_their_own_batches(tiny_chat):
    """A batch mixing generation settings gives each row exactly what the same batch with
    that row's settings gives it: greedy rows do not depend on when others stop."""
    from langchain_core.messages import HumanMessage

    from speceyes_graph.models.batching import RowKeys

    large = tiny_chat["large"]
    prepared = [large._prepare([HumanMessage(content=t)]) for t in ("a red cube", "two blue dots")]
    long_key, _ = large._settings(None, {"max_tokens": 12})
    alone = large.generation.run_batch(long_key, prepared)
    text = alone[1].content
    assert len(text) > 3
    stop = text[1:3]  # a stop string the second row is known to produce
    short_key, _ = large._settings([stop], {"max_tokens": 12})
    shorter_key, _ = large._settings(None, {"max_tokens": 4})
    for row_key in (short_key, shorter_key):
        same = large.generation.run_batch(
            row_key, prepared
        )  # both rows with the second one's settings
        mixed = large.generation.run_batch(RowKeys([long_key, row_key]), prepared)
        assert mixed[0].content == alone[0].content
        assert mixed[0].response_metadata == alone[0].response_metadata
        assert mixed[1].content == same[1].content
        assert mixed[1].response_metadata == same[1].response_metadata
        assert mixed[1].usage_metadata == same[1].usage_metadata


def test_the_cpu_gate_goes_by_deadline_and_is_reentrant():
    from speceyes_tools.deadlines import EarliestDeadlineFirst, deadline_scope

    gate = EarliestDeadlineFirst(1)
    order = []
    release = threading.Event()

    def holder():
        with gate("hold"):
            with gate("nested"):  # same thread: no second slot, no deadlock
                release.wait(10)

    def waiter(name, deadline):
        with deadline_scope(deadline), gate(name):
            order.append(name)

    t = threading.Thread(target=holder)
    t.start()
    time.sleep(0.05)
    now = time.time()
    waiters = [
        threading.Thread(target=waiter, args=(name, now + d))
        for name, d in (("late", 60), ("early", 10), ("middle", 30))
    ]
    for w in waiters:
        w.start()
        time.sleep(0.02)
    release.set()
    for w in [t, *waiters]:
        w.join(timeout=10)
    assert order == ["early", "middle", "late"]


def test_async_blocking_work_goes_oldest_query_first():
    """Under ``abatch`` each query's blocking work (decode, then request preparation) is
    queued for worker threads; first come first served (``asyncio.to_thread``) prepares
    breadth-first, so the first batch waits for every decode. The oldest query's next
    stage must jump the younger queries' decodes: with three waves of decodes queued, query
    0's preparation starts before the last decode does."""
    from speceyes_graph.effects import Blocking, arun_steps
    from speceyes_tools.deadlines import deadline_scope

    workers = min(32, (os.cpu_count() or 1) + 4)  # as many as asyncio's default executor
    n = 3 * workers
    started: list[tuple[str, int]] = []

    def work(stage: str, i: int) -> None:
        started.append((stage, i))
        time.sleep(0.05)

    def query(i: int):
        yield Blocking(work, ("decode", i))
        yield Blocking(work, ("prepare", i))

    async def one(i: int, now: float) -> None:
        with deadline_scope(now + 60 + i):  # query i arrived i-th
            await arun_steps(query(i))

    async def all_queries() -> None:
        now = time.time()
        await asyncio.gather(*(one(i, now) for i in range(n)))

    asyncio.run(all_queries())
    assert started.index(("prepare", 0)) < started.index(("decode", n - 1)), started


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_worker_threads_survive_a_fork():
    """A server that forks its workers after the graph ran in the parent (imported, warmed
    up) must not inherit worker threads that do not exist in the child: the parent's pool
    and reusable threads are started again there, not waited on forever."""
    from speceyes_tools.deadlines import start_in_background, to_worker_thread

    assert asyncio.run(to_worker_thread(lambda: 1)) == 1  # the parent's pool and threads
    assert start_in_background(lambda: 2).result(5) == 2
    time.sleep(0.1)  # the reused thread back in the idle list
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if both kinds of worker still run work
        ok = False
        try:
            again = asyncio.run(asyncio.wait_for(to_worker_thread(lambda: 3), 5))
            ok = again == 3 and start_in_background(lambda: 4).result(5) == 4
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_orchestration_benchmark_models_keep_nothing():
    """The instant models of the orchestration benchmark keep no record of their calls:
    kept, the messages of thousands of calls made every later run slower (the collector
    traversing them), so the benchmark measured its own history. The scripted model the
    tests use still keeps them."""
    from speceyes_graph.benchmarks.orchestration import _Instant

    instant = _Instant(respond=lambda m: "A")
    assert instant.invoke("hi").content == "A"
    assert instant.calls == 1 and instant.received == [] and instant.call_kwargs == []
    scripted = ScriptedChatModel(respond=lambda m: "A")
    scripted.invoke("hi")
    assert len(scripted.received) == 1


def test_prompts_over_resized_images_skip_the_thread_hop(tmp_path, monkeypatch):
    """abatch reads an image and builds a prompt in a worker thread only while there is
    decoding or resizing to do: asked again about the same images (POPE asks three questions
    per image; an agent turn reuses the view), intake and the judge's and the draft's prompts
    are lookups, run in place. The answers are the same either way."""
    from speceyes_graph import effects
    from speceyes_graph.benchmarks.throughput import instant_graph

    paths = [_image(tmp_path, f"i{i}.png", 200 + 10 * i, 150, i)[0] for i in range(3)]
    graph = instant_graph(ImageStore())
    hops = []
    real = effects.to_worker_thread

    async def counted(fn, *args):
        hops.append(getattr(fn, "__qualname__", ""))
        return await real(fn, *args)

    monkeypatch.setattr(effects, "to_worker_thread", counted)
    queries = [{"question": f"q{i}", "images": [p]} for i, p in enumerate(paths)]
    first = asyncio.run(graph.abatch(queries))
    # intake's decode, then the judge's resize; the draft's frame is the same here: a lookup
    assert len(hops) == 2 * len(queries), hops
    hops.clear()
    again = asyncio.run(graph.abatch([{**q, "question": q["question"] + "?"} for q in queries]))
    assert hops == []  # the images decoded and resized: intake and both prompts in place
    assert [o["answer"] for o in again] == [o["answer"] for o in first] == ["A"] * 3
    assert [o["route"] for o in again] == ["speculative"] * 3
