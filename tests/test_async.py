"""The graph is async-native: under ainvoke/abatch every node awaits, and gives what batch gives.

- ``batch`` and ``abatch`` return the same outputs (everything but timings), for every mode,
  both speculation schedules, the chat front, and the demo checkpoints;
- under ``abatch`` a query waiting on its model holds no thread: hundreds in flight at once
  on a handful of threads;
- deadlines and the cancellation of moot parallel drafts work on the async path too.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from helpers import deepeyes_agent, judge, question_of, speculator
from speceyes_graph import Limits, create_speceyes_graph
from speceyes_graph.integrations.chat import create_speceyes_chat_graph
from speceyes_graph.models import ScriptedChatModel

_VARIES = ("timings", "latency_s", "started_at", "deadline", "id")  # clocks, generated ids


def comparable(value: Any) -> Any:
    """An output without what differs between any two runs (clocks, generated ids)."""
    if isinstance(value, BaseMessage):
        value = value.model_dump()
    if isinstance(value, dict):
        # how far a discarded parallel draft got when the judge finished is a race, on
        # either path; what it would have said is never used
        moot = ("note",) if value.get("discarded") else ()
        return {
            k: comparable(v)
            for k, v in value.items()
            if not any(k.endswith(x) for x in _VARIES) and k not in moot
        }
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    return value


def both_ways(graph, inputs: list[dict], config: dict | None = None) -> tuple[list, list]:
    config = {"max_concurrency": 8, **(config or {})}
    sync = graph.batch(inputs, config)
    asynchronous = asyncio.run(graph.abatch(inputs, config))
    return [comparable(o) for o in sync], [comparable(o) for o in asynchronous]


def mixed_queries(scene: str, tmp_path) -> list[dict]:
    """Every route: tool-free and confident, tool-free but unsure, needs tools, broken."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    return [
        {"question": "What colour is the square?", "images": [scene], "options": ["red", "blue"]},
        {"question": "Is it unsure?", "images": [scene]},
        {"question": "Read the tiny label (tools).", "images": [scene]},
        {"question": "What colour? (tools)", "images": [scene], "options": ["red", "blue"]},
        {"question": "What is this?", "images": [str(broken)]},
        {"question": "Bad \ud800 text", "images": [scene]},
    ]


def models() -> dict:
    return {
        "judge": judge(lambda q: "yes" if "(tools)" in q else "no"),
        "speculator": speculator("A", separability=lambda q: 4.0 if "unsure" in q else 9.0),
        "agent": deepeyes_agent(answer="B"),
    }


@pytest.mark.parametrize(
    "mode, speculation",
    [
        ("speceyes", "after_judge"),
        ("speceyes", "parallel"),
        ("agent", "after_judge"),
        ("small", "after_judge"),
        ("specreason", "after_judge"),
    ],
)
def test_batch_and_abatch_give_the_same_outputs(scene, tmp_path, mode, speculation):
    graph = create_speceyes_graph(**models(), mode=mode, speculation=speculation).compile()
    sync, asynchronous = both_ways(graph, mixed_queries(scene, tmp_path))
    assert asynchronous == sync
    routes = [o["route"] for o in sync]
    if mode == "speceyes":
        assert {"speculative", "rejected-agentic", "judged-agentic"} <= set(routes)
    assert sum(1 for o in sync if o["error"]) == 2  # the broken image and the bad text only
    assert sum(1 for o in sync if o["answer"]) == 4


def test_the_chat_graph_answers_the_same_under_abatch(scene):
    chat = create_speceyes_chat_graph(**models()).compile()
    inputs = [
        {"messages": [HumanMessage(content=[{"type": "text", "text": q}, image])]}
        for q in ("What colour is it?", "Find the label (tools).")
        for image in [{"type": "image", "url": scene}]
    ]
    sync, asynchronous = both_ways(chat, inputs)
    assert asynchronous == sync
    assert [o["route"] for o in sync] == ["speculative", "judged-agentic"]
    assert [o["messages"][-1]["content"] for o in sync] == ["A", "B"]


_waiting = {"now": 0, "peak": 0}


class _InFlight(ScriptedChatModel):
    """A served model's stand-in that counts the calls waiting at once."""

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        _waiting["now"] += 1
        _waiting["peak"] = max(_waiting["peak"], _waiting["now"])
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            _waiting["now"] -= 1
        return self._reply(messages, stop, kwargs)


class _PeakThreads:
    def __init__(self):
        self.peak = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, threading.active_count())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_queries_in_flight_under_abatch_hold_no_thread(scene):
    """300 queries whose judge takes a second: all wait at once, on a handful of threads
    (the old graph ran each node in an executor: at most its few workers in flight)."""
    n = 300
    slow_judge = _InFlight(respond=lambda m: "no", delay_s=1.0)
    graph = create_speceyes_graph(
        judge=slow_judge, speculator=speculator("A", 9.0), agent=deepeyes_agent()
    ).compile()
    inputs = [{"question": f"What colour? ({i})", "images": [scene]} for i in range(n)]
    asyncio.run(graph.ainvoke(inputs[0]))  # warm: imports, decode cache, executor threads
    _waiting["peak"] = 0
    before = threading.active_count()
    with _PeakThreads() as threads:
        outs = asyncio.run(graph.abatch(inputs, {"max_concurrency": n}))
    assert [o["route"] for o in outs] == ["speculative"] * n
    assert _waiting["peak"] >= 0.9 * n
    assert threads.peak - before <= 40  # asyncio's default executor: min(32, CPUs + 4)


def test_a_hung_model_times_out_under_ainvoke_and_is_cancelled(scene):
    cancelled = []

    class Hung(ScriptedChatModel):
        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
            if "hang" not in question_of(messages):
                return self._reply(messages, stop, kwargs)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(question_of(messages))
                raise

    graph = create_speceyes_graph(
        judge=Hung(respond=lambda m: "no"),
        speculator=speculator("A", 9.0),
        agent=deepeyes_agent(),
        limits=Limits(model_timeout_s=0.5),
    ).compile()
    inputs = [{"question": q, "images": [scene]} for q in ("hang here", "fine")]
    t0 = time.perf_counter()
    outs = asyncio.run(graph.abatch(inputs))
    assert time.perf_counter() - t0 < 30  # bounded by the timeout, not the 60 s sleep
    assert "judge took longer than 0.5 s" in outs[0]["error"]
    assert outs[1]["route"] == "speculative" and outs[1]["answer"] == "A"
    assert len(cancelled) == 1  # nothing left running


def test_a_moot_parallel_draft_is_cancelled_under_ainvoke(scene):
    """The judge asks for tools while the draft is still waiting on its server: the draft's
    request is cancelled (a served model's HTTP request is closed), not left to finish."""
    events = []

    class SlowDraft(ScriptedChatModel):
        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
            events.append("draft started")
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                events.append("draft cancelled")
                raise
            return self._reply(messages, stop, kwargs)

    graph = create_speceyes_graph(
        judge=ScriptedChatModel(respond=lambda m: "yes", delay_s=0.3),  # the draft starts first
        speculator=SlowDraft(respond=lambda m: AIMessage(content="A")),
        agent=deepeyes_agent(answer="B"),
        speculation="parallel",
    ).compile()

    async def run():
        out = await graph.ainvoke({"question": "Where? (tools)", "images": [scene]})
        await asyncio.sleep(0.05)  # let the cancellation land
        return out

    out = asyncio.run(run())
    assert out["route"] == "judged-agentic" and out["answer"] == "B"
    assert out["draft"]["discarded"] is True
    assert events == ["draft started", "draft cancelled"]


def test_streaming_is_the_same_under_astream(scene):
    """updates and custom events (the agent's steps), from the subgraph too, in order."""
    graph = create_speceyes_graph(**models()).compile()
    question = {"question": "Read it (tools).", "images": [scene]}

    def events(chunks):
        return [
            (namespace[0].split(":")[0] if namespace else "", mode, json.dumps(comparable(chunk)))
            for namespace, mode, chunk in chunks
        ]

    options = {"stream_mode": ["updates", "custom"], "subgraphs": True}
    sync = events(graph.stream(question, **options))

    async def collect():
        return [c async for c in graph.astream(question, **options)]

    assert events(asyncio.run(collect())) == sync
    assert [e[:2] for e in sync].count(("agent_loop", "custom")) == 2  # two agent steps


def test_the_demo_checkpoints_answer_the_same_under_abatch(tmp_path):
    """The real local backend: ChatTransformersVLM's batch worker awaited, not blocked on.
    One request per generate call, so results cannot depend on which requests share one."""
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models, demo_queries

    small_large = demo_models(batch_size=1)
    queries = demo_queries(tmp_path, 6, seed=5)
    inputs = [{"question": q.question, "images": [q.image], "options": q.options} for q in queries]
    for speculation in ("after_judge", "parallel"):
        graph = create_speceyes_graph(
            speculator=small_large["small"],
            agent=small_large["large"],
            speculation=speculation,
            **DEMO_GRAPH_SETTINGS,
        ).compile()
        sync, asynchronous = both_ways(graph, inputs)
        assert asynchronous == sync
        assert {o["route"] for o in sync} >= {"speculative", "judged-agentic"}


def test_a_node_body_handles_its_requests_failures_the_same_on_both_drivers():
    """A request that fails is raised at its ``yield``; the body's own ``except`` and
    ``finally`` run on both paths, and what the body returns is the node's update."""
    from speceyes_graph.effects import Blocking, arun_steps, run_steps

    def boom():
        raise ValueError("broken image")

    def body(log):
        try:
            yield Blocking(boom)
        except ValueError as exc:
            log.append(f"caught {exc}")
            size = yield Blocking(len, ("four",))
            return {"size": size}
        finally:
            log.append("cleaned up")

    sync_log, async_log = [], []
    assert run_steps(body(sync_log)) == {"size": 4}
    assert asyncio.run(arun_steps(body(async_log))) == {"size": 4}
    assert sync_log == async_log == ["caught broken image", "cleaned up"]


def test_acall_with_deadline_reports_its_own_timeout_and_the_callees_apart():
    from speceyes_tools.deadlines import DeadlineExceeded, acall_with_deadline

    async def slow():
        await asyncio.sleep(5)

    async def raises_timeout():
        raise TimeoutError("the server said 504")

    async def run():
        with pytest.raises(DeadlineExceeded, match="took longer than 0.05 s"):
            await acall_with_deadline(slow, timeout=0.05, what="the call")
        with pytest.raises(TimeoutError, match="the server said 504"):
            await acall_with_deadline(raises_timeout, timeout=1.0, what="the call")

    asyncio.run(run())
