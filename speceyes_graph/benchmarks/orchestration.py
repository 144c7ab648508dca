"""What the graph costs the host beside the models: orchestration with models that answer
at once, against LangGraph's own floor.

- :func:`orchestration_vs_floor`: CPU per query of ``graph.abatch`` over 1,000 queries in
  flight (intake, judge, speculate, gate), against five async no-op nodes (LangGraph's floor)
  and against the *shape floor*: a graph of the same state, nodes and edges whose nodes do
  nothing but make the same two chat-model calls. The first ratio is what the issue sets a
  target for; the second says how much of the cost is ours and how much the frameworks'
  (a LangGraph task per node, langchain-core's callback machinery per model call).
- :func:`orchestration_ms`: the same one query at a time, as the ceiling report prints it.

Used by ``scripts/bench_throughput.py --parts orchestration`` (and ``--quick``, in CI).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from speceyes_tools.images import ImageStore

from ..graph.build import create_speceyes_graph
from ..models.scripted import ScriptedChatModel, fake_logprobs
from ..state import SpecEyesInput, SpecEyesOutput, SpecEyesState

__all__ = [
    "OrchestrationResult",
    "athrough_judge",
    "instant_graph",
    "orchestration_ms",
    "orchestration_vs_floor",
    "shape_floor_graph",
    "through_judge",
]


def orchestration_ms(
    phase: str, queries: Sequence[SpecEyesInput], store: ImageStore | None = None, reps: int = 2
) -> float:
    """Per-query wall time of the graph with models that answer instantly (one at a time):
    what LangGraph and our nodes cost, images already decoded."""
    reply = AIMessage(content="A", response_metadata={"logprobs": fake_logprobs(["A"], [9.0])})
    instant = _Instant(respond=lambda m: reply)
    if phase == "speculation":
        graph = create_speceyes_graph(speculator=instant, mode="small", store=store).compile()
    else:  # intake and judge, as the judge phase is measured
        judge = _Instant(respond=lambda m: "no")
        graph = create_speceyes_graph(
            judge=judge, speculator=instant, agent=instant, store=store
        ).compile()
    run = graph.invoke if phase == "speculation" else (lambda q: through_judge(graph, q))
    for q in queries[:4]:
        run(q)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for q in queries:
            run(q)
        times.append((time.perf_counter() - t0) / len(queries))
    return 1000 * min(times)


@dataclass
class OrchestrationResult:
    """Host CPU per query with models that answer at once, against LangGraph's own floor."""

    n: int
    floor_ms: float  # CPU ms per query: LangGraph, five no-op nodes, abatch
    ours_ms: float  # CPU ms per query: the SpecEyes graph, speculative route, abatch
    floor_wall_s: float
    ours_wall_s: float
    shape_ms: float | None = None  # CPU ms per query: the same graph shape doing nothing

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.floor_ms

    def report(self) -> str:
        line = (
            f"orchestration, abatch of {self.n} in flight, instant models: SpecEyes graph "
            f"{self.ours_ms:.2f} ms CPU/query ({self.ours_wall_s:.2f} s wall), LangGraph's floor "
            f"(five no-op nodes) {self.floor_ms:.2f} ms ({self.floor_wall_s:.2f} s) -> "
            f"{self.ratio:.2f}x the floor"
        )
        if self.shape_ms is not None:
            line += (
                f"\n   the same graph shape doing nothing but the two model calls (frameworks "
                f"only): {self.shape_ms:.2f} ms ({self.shape_ms / self.floor_ms:.2f}x the floor) "
                f"-> ours {self.ours_ms / self.shape_ms:.2f}x the frameworks' cost"
            )
        return line


def _floor_graph(nodes: int = 5) -> Any:
    """LangGraph's own cost: ``nodes`` async no-op nodes in a line over a one-key state."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class Count(TypedDict):
        step: int

    async def step(state: Count) -> dict:
        return {"step": state["step"] + 1}

    graph = StateGraph(Count)
    previous = START
    for i in range(nodes):
        graph.add_node(f"node{i}", step)
        graph.add_edge(previous, f"node{i}")
        previous = f"node{i}"
    graph.add_edge(previous, END)
    return graph.compile()


def _cpu_of(run: Callable[[], Any]) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of ``run()``: CPU counts every thread's work."""
    c0, t0 = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - c0, time.perf_counter() - t0


def shape_floor_graph() -> Any:
    """The SpecEyes graph's shape with nothing of ours in it: the same state (its channels),
    the same nodes and conditional edges on the speculative route, and the same two
    chat-model calls (a scripted model answering at once, through ``ainvoke``), the nodes
    writing what ours write on that route and doing nothing else."""
    judge = _Instant(respond=lambda m: "no")
    reply = AIMessage(content="A", response_metadata={"logprobs": fake_logprobs(["A"], [9.0])})
    speculator = _Instant(respond=lambda m: reply)

    async def intake(state: SpecEyesState) -> dict:
        query = {"question": state["question"], "images": state["images"], "options": None}
        return {"query": query, "settings": {"mode": "speceyes"}, "deadline": 0.0}

    async def judge_node(state: SpecEyesState) -> dict:
        said = await judge.ainvoke([HumanMessage(state["query"]["question"])])
        return {"judge_output": said.content, "route": None}

    async def speculate(state: SpecEyesState) -> dict:
        draft = await speculator.ainvoke([HumanMessage(state["query"]["question"])])
        return {"draft": {"text": draft.content}}

    async def gate(state: SpecEyesState) -> dict:
        return {"answer": (state.get("draft") or {}).get("text"), "route": "speculative"}

    async def route(state: SpecEyesState) -> str:
        return "on"

    graph = StateGraph(SpecEyesState, input_schema=SpecEyesInput, output_schema=SpecEyesOutput)
    for name, fn in (("intake", intake), ("judge", judge_node), ("speculate", speculate)):
        graph.add_node(name, fn)
    graph.add_node("gate", gate)
    graph.add_edge(START, "intake")
    graph.add_conditional_edges("intake", route, {"on": "judge"})
    graph.add_conditional_edges("judge", route, {"on": "speculate"})
    graph.add_edge("speculate", "gate")
    graph.add_conditional_edges("gate", route, {"on": END})
    return graph.compile()


def instant_graph(store: ImageStore | None = None) -> Any:
    """The compiled graph over models that answer at once: the judge says "no", the draft
    "A" with a sure log-prob, so every query goes intake, judge, speculate, gate (accepted)."""
    reply = AIMessage(content="A", response_metadata={"logprobs": fake_logprobs(["A"], [9.0])})
    return create_speceyes_graph(
        judge=_Instant(respond=lambda m: "no"),
        speculator=_Instant(respond=lambda m: reply),
        agent=_Instant(respond=lambda m: "A"),
        store=store,
    ).compile()


def orchestration_vs_floor(
    queries: Sequence[SpecEyesInput], n: int = 1000, store: ImageStore | None = None, reps: int = 2
) -> OrchestrationResult:
    """The graph's host cost (CPU per query, ``abatch`` of ``n`` queries in flight, models
    answering at once, every query tool-free and accepted: intake, judge, speculate, gate)
    against LangGraph's floor (five no-op nodes) in the same process, best of ``reps``. The
    ``n`` queries cycle over ``queries``' images with distinct questions; images are decoded
    before timing (their decode is measured elsewhere), so what is left is bookkeeping."""
    graph = instant_graph(store)
    inputs: list[SpecEyesInput] = [
        {**queries[i % len(queries)], "question": f"{queries[i % len(queries)]['question']} [{i}]"}
        for i in range(n)
    ]
    floor, shape = _floor_graph(), shape_floor_graph()
    floor_inputs = [{"step": 0} for _ in range(n)]
    config: RunnableConfig = {"max_concurrency": n}
    asyncio.run(graph.abatch(inputs[: len(queries)], config))  # warm-up, images decoded
    asyncio.run(floor.abatch(floor_inputs[:10], config))
    asyncio.run(shape.abatch(inputs[:10], config))
    ours, base, bare = [], [], []
    for _ in range(reps):
        base.append(_cpu_of(lambda: asyncio.run(floor.abatch(floor_inputs, config))))
        bare.append(_cpu_of(lambda: asyncio.run(shape.abatch(inputs, config))))
        ours.append(_cpu_of(lambda: asyncio.run(graph.abatch(inputs, config))))
    best, best_floor = min(ours), min(base)
    return OrchestrationResult(
        n=n,
        floor_ms=1000 * best_floor[0] / n,
        ours_ms=1000 * best[0] / n,
        floor_wall_s=best_floor[1],
        ours_wall_s=best[1],
        shape_ms=1000 * min(bare)[0] / n,
    )


def through_judge(graph: Any, query: SpecEyesInput) -> None:
    """Run ``graph`` on ``query`` up to and including its judge node, then stop it."""
    for update in graph.stream(query, stream_mode="updates"):
        if "judge" in update or "intake" in update and update["intake"].get("error"):
            return


async def athrough_judge(graph: Any, query: SpecEyesInput) -> None:
    async for update in graph.astream(query, stream_mode="updates"):
        if "judge" in update or "intake" in update and update["intake"].get("error"):
            return


class _Instant(ScriptedChatModel):
    """Called like a local model: in the caller's thread, with image references."""

    handles_deadlines: ClassVar[bool] = True
    accepts_image_refs: ClassVar[bool] = True
    record: bool = False  # nothing kept per call: see ScriptedChatModel.record
