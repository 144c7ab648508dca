"""How close the graph runs to the raw model, and what parallel speculation buys.

Used by ``scripts/bench_throughput.py`` (CPU: tiny and demo checkpoints) and
``scripts/bench_gpu.py`` (full-size architectures). Everything here measures and prints;
nothing asserts a speed.

- :func:`ceiling`: the graph through one phase (speculation: ``graph.batch(N)`` in mode
  ``small``; judge: N queries on N threads, as ``graph.batch`` runs them, each stopped after
  its judge node) against the
  *raw ceiling*: the same requests built by the same prompt functions, prepared one after
  another and run straight through the model's batched path in batches of the same size.
  Both start cold (image store and processed-image cache cleared), as a real query does.
- :func:`~speceyes_graph.benchmarks.orchestration.orchestration_vs_floor` (in
  :mod:`.orchestration`, imported here as before): the host cost with models that answer at
  once, against LangGraph's floor.
- :func:`compare_speculation`: the mixed workload (judge, drafts, agent loops) under
  ``speculation="after_judge"`` and ``"parallel"``, side by side: throughput, per-query
  latency, mean batch size per model, discarded drafts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from speceyes_tools.images import ImageStore, default_store, store_scope

from ..graph.build import create_speceyes_graph
from ..messages import user_message
from ..models.scripted import fake_logprobs
from ..prompts import Prompts
from ..protocol import message_text
from ..state import SpecEyesInput
from .orchestration import (
    OrchestrationResult,
    athrough_judge,
    instant_graph,
    orchestration_ms,
    orchestration_vs_floor,
    through_judge,
)

__all__ = [
    "CeilingResult",
    "FixedDecisionJudge",
    "shape_queries",
    "SpeculationResult",
    "ceiling",
    "compare_speculation",
    "orchestration_ms",
    "OrchestrationResult",
    "instant_graph",
    "orchestration_vs_floor",
]


@dataclass
class CeilingResult:
    phase: str
    n: int
    graph_s: float  # median wall time of graph.batch(N)
    raw_s: float  # median wall time of the raw path (preparation + model)
    raw_prepare_s: float
    raw_model_s: float
    graph_model_s: float  # time inside generate calls during the graph run
    first_batch_s: float  # graph run: from the start to the first generate call
    after_last_s: float  # graph run: from the end of the last generate call to the end
    calls: int
    mean_batch: float
    mean_queued_s: float
    orchestration_ms: float | None = None  # LangGraph + our nodes per query, instant models
    driver: str = "batch"  # graph.batch (a thread per query) or graph.abatch (the event loop)
    offloaded_s: float | None = None  # each batch a wait of this long, off the CPU (_Offloaded)

    @property
    def ratio(self) -> float:
        """Graph throughput over raw throughput (1.0: the graph costs nothing)."""
        return self.raw_s / self.graph_s

    def report(self) -> str:
        model = (
            ""
            if self.offloaded_s is None
            else f", model off the CPU ({self.offloaded_s:.2f} s a batch)"
        )
        lines = [
            f"{self.phase} phase{model}, N={self.n}: graph.{self.driver} {self.graph_s:.2f} s "
            f"({self.n / self.graph_s:.1f} q/s), raw ceiling {self.raw_s:.2f} s "
            f"({self.n / self.raw_s:.1f} q/s) -> ratio {self.ratio:.2f}",
            f"   raw: prepare {self.raw_prepare_s:.2f} s + model {self.raw_model_s:.2f} s",
        ]
        if self.offloaded_s is not None:  # no generate loop to share the GIL with
            lines.append(f"   graph: first batch after {self.first_batch_s:.2f} s")
            return "\n".join(lines)
        lines += [
            f"   graph: {self.calls} generate calls (mean batch {self.mean_batch:.1f}), "
            f"model busy {self.graph_model_s:.2f} s "
            f"(+{self.graph_model_s - self.raw_model_s:.2f} s over raw: the generate loop "
            "sharing the GIL and cores with the graph)",
            f"   graph: first generate after {self.first_batch_s:.2f} s (requests being "
            f"prepared), {self.after_last_s:.2f} s after the last; mean queue wait "
            f"{1000 * self.mean_queued_s:.0f} ms/request",
        ]
        if self.orchestration_ms is not None:
            lines.append(
                f"   LangGraph + nodes with instant models: {self.orchestration_ms:.1f} ms/query "
                f"({self.orchestration_ms * self.n / 1000:.2f} s of GIL time for N={self.n})"
            )
        return "\n".join(lines)


class _Timeline:
    """Wraps a model's batch runner to record when each generate call ran."""

    def __init__(self, model: Any):
        self.model = model
        self.spans: list[tuple[float, float]] = []
        self._inner = model.scheduler.run_batch

    def __enter__(self) -> _Timeline:
        def run(key, payloads):
            t0 = time.perf_counter()
            try:
                return self._inner(key, payloads)
            finally:
                self.spans.append((t0, time.perf_counter()))

        self.model.scheduler.run_batch = run
        return self

    def __exit__(self, *exc: Any) -> None:
        self.model.scheduler.run_batch = self._inner


class _Offloaded:
    """The model's batches as the host sees them on an accelerator: a wait of ``batch_s``
    that holds neither a CPU nor the GIL, one sure "A" per request. What is left on the CPU
    is the preparation, so the graph's time against the raw path's says whether the next
    chunk's preparation overlaps the current chunk's model call (on 2 CPU cores the real
    ``generate`` competes with the preparation for both, which hides it)."""

    def __init__(self, model: Any, batch_s: float | None):
        self.model, self.batch_s = model, batch_s

    def run_batch(self, key: Any, payloads: Sequence[Any], **_: Any) -> list[AIMessage]:
        assert self.batch_s is not None
        time.sleep(self.batch_s)
        logprobs = fake_logprobs(["A"], [9.0])
        return [AIMessage(content="A", response_metadata={"logprobs": logprobs}) for _ in payloads]

    def __enter__(self) -> _Offloaded:
        if self.batch_s is not None:
            self._saved = self.model.scheduler.run_batch, self.model.generation.run_batch
            self.model.scheduler.run_batch = self.model.generation.run_batch = self.run_batch
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.batch_s is not None:
            self.model.scheduler.run_batch, self.model.generation.run_batch = self._saved


def _cold(store: ImageStore, *models: Any) -> None:
    store.clear()
    for m in models:
        cache = getattr(getattr(m, "processor", None), "image_processor", None)
        if cache is not None and hasattr(cache, "clear"):
            cache.clear()


def _phase_messages(phase: str, query: dict, prompts: Prompts, resize: Any, store: ImageStore):
    suffix = prompts.judge_suffix if phase == "judge" else prompts.speculator_suffix
    system = prompts.judge_system if phase == "judge" else prompts.speculator_system
    text = prompts.question(query["question"], query.get("options")) + suffix
    return [
        SystemMessage(content=system),
        user_message(query.get("images"), text, resize, store),
    ]


def _raw(phase, model, queries, prompts, max_tokens, store) -> tuple[float, float]:
    """The raw ceiling: build and prepare every request in turn, then batched generate."""
    key, request = model._settings(None, {"max_tokens": max_tokens})
    t0 = time.perf_counter()
    with store_scope(store):
        prepared = [
            model._prepare(_phase_messages(phase, q, prompts, model.resize_spec, store), **request)
            for q in queries
        ]
    t1 = time.perf_counter()
    size = model.scheduler.max_batch_size  # the graph's batches are this big too
    for i in range(0, len(prepared), size):
        model.generation.run_batch(key, prepared[i : i + size])
    return t1 - t0, time.perf_counter() - t1


def ceiling(
    phase: str,
    *,
    small: Any,
    large: Any,
    queries: Sequence[SpecEyesInput],
    reps: int = 3,
    store: ImageStore | None = None,
    graph_settings: dict[str, Any] | None = None,
    orchestration: bool = True,
    driver: str = "batch",
    offloaded_s: float | None = None,
) -> CeilingResult:
    """Graph throughput against the raw ceiling for ``phase`` (``judge`` or ``speculation``),
    the graph run with ``graph.batch`` (``driver="batch"``) or ``graph.abatch``.
    ``offloaded_s``: each batch of the model is a wait of that long instead of ``generate``
    (the model off the CPU, as on an accelerator: :class:`_Offloaded`)."""
    if phase not in ("judge", "speculation"):
        raise ValueError(f"phase must be 'judge' or 'speculation', got {phase!r}")
    if driver not in ("batch", "abatch"):
        raise ValueError(f"driver must be 'batch' or 'abatch', got {driver!r}")
    store = store or default_store()
    settings = dict(graph_settings or {})
    prompts = settings.get("prompts") or Prompts()
    n = len(queries)
    if phase == "speculation":
        model = small
        graph = create_speceyes_graph(speculator=small, mode="small", store=store, **settings)
        compiled = graph.compile()
        max_tokens = settings.get("draft_max_tokens", 20)

        def run_graph(rep: int) -> None:
            if driver == "abatch":
                asyncio.run(compiled.abatch(list(queries), {"max_concurrency": n}))
            else:
                compiled.batch(list(queries), {"max_concurrency": n})

    else:  # the graph through its judge node: each query streamed, stopped after the judge
        model = large
        compiled = create_speceyes_graph(
            speculator=small, agent=large, store=store, **settings
        ).compile()
        max_tokens = settings.get("judge_max_tokens", 10)

        def run_graph(rep: int) -> None:
            if driver == "abatch":  # a task per query, as graph.abatch

                async def all_through_judge() -> None:
                    await asyncio.gather(*(athrough_judge(compiled, q) for q in queries))

                asyncio.run(all_through_judge())
                return
            with ThreadPoolExecutor(n) as pool:  # a thread per query, as graph.batch
                list(pool.map(lambda q: through_judge(compiled, q), queries))

    with _Offloaded(model, offloaded_s):
        run = _CeilingRun(
            phase=phase,
            model=model,
            queries=queries,
            store=store,
            prompts=prompts,
            max_tokens=max_tokens,
            run_graph=run_graph,
        )
        return _measure_ceiling(
            run, reps=reps, driver=driver, orchestration=orchestration, offloaded_s=offloaded_s
        )


@dataclass(frozen=True)
class _CeilingRun:
    """One phase to measure both ways: the graph (``run_graph(rep)``; rep -1 is the warm-up)
    and the raw ceiling (:meth:`raw`: the same requests straight through ``model``)."""

    phase: str  # "judge" or "speculation"
    model: Any  # the model the phase runs
    queries: Sequence[SpecEyesInput]
    store: ImageStore
    prompts: Prompts
    max_tokens: int  # the phase's generation length
    run_graph: Callable[[int], None]

    def cold(self) -> None:
        _cold(self.store, self.model)

    def raw(self) -> tuple[float, float]:
        return _raw(self.phase, self.model, self.queries, self.prompts, self.max_tokens, self.store)


def _measure_ceiling(
    run: _CeilingRun, *, reps: int, driver: str, orchestration: bool, offloaded_s: float | None
) -> CeilingResult:
    """``reps`` timed runs of each path after a warm-up; the medians, and the model's stats of
    the graph run nearest the median. ``driver``, ``offloaded_s``: recorded as given;
    ``orchestration``: also measure the host cost per query."""
    phase, model, queries, store = run.phase, run.model, run.queries, run.store
    n = len(queries)
    run.cold()
    run.run_graph(-1)  # warm-up of both paths (first calls allocate, import, compile)
    run.cold()
    run.raw()
    graph_s, raw = [], []
    busy, calls, requests, queued, first, after = [], [], [], [], [], []
    for rep in range(reps):
        run.cold()
        t0 = time.perf_counter()
        raw_prepare, raw_model = run.raw()
        raw.append((time.perf_counter() - t0, raw_prepare, raw_model))
        run.cold()
        stats = model.scheduler.stats
        b0, c0, r0, q0 = stats.busy_s, stats.calls, stats.requests, stats.queued_s
        with _Timeline(model) as timeline:
            t0 = time.perf_counter()
            run.run_graph(rep)
            t1 = time.perf_counter()
        graph_s.append(t1 - t0)
        busy.append(stats.busy_s - b0)
        calls.append(stats.calls - c0)
        requests.append(stats.requests - r0)
        queued.append((stats.queued_s - q0) / max(1, stats.requests - r0))
        first.append(min(s for s, _ in timeline.spans) - t0 if timeline.spans else float("nan"))
        after.append(t1 - max(e for _, e in timeline.spans) if timeline.spans else float("nan"))
    med = statistics.median
    best = min(range(reps), key=lambda i: abs(graph_s[i] - med(graph_s)))
    raw_best = min(range(reps), key=lambda i: abs(raw[i][0] - med(r[0] for r in raw)))
    return CeilingResult(
        phase=phase,
        n=n,
        graph_s=med(graph_s),
        raw_s=med(r[0] for r in raw),
        raw_prepare_s=raw[raw_best][1],
        raw_model_s=raw[raw_best][2],
        graph_model_s=busy[best],
        first_batch_s=first[best],
        after_last_s=after[best],
        calls=calls[best],
        mean_batch=requests[best] / max(1, calls[best]),
        mean_queued_s=queued[best],
        orchestration_ms=orchestration_ms(phase, queries, store=store) if orchestration else None,
        driver=driver,
        offloaded_s=offloaded_s,
    )


def shape_queries(folder: Path, n: int, seed: int = 0) -> list[SpecEyesInput]:
    """N queries on their own small PNG files (a coloured square on grey, 300-900 px), four
    question kinds in turn: the workload the CPU benchmarks share."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    queries: list[SpecEyesInput] = []
    for i in range(n):
        w, h = int(rng.integers(300, 900)), int(rng.integers(240, 700))
        arr = np.full((h, w, 3), 245, np.uint8)
        x, y = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        arr[y : y + 40, x : x + 40] = rng.integers(0, 255, 3)
        path = folder / f"q{i}.png"
        Image.fromarray(arr).save(path)
        queries.append(
            {
                "question": f"{_QUESTIONS[i % 4]} (#{i})",
                "images": [str(path)],
                "options": ["red", "blue", "green", "yellow"],
            }
        )
    return queries


_QUESTIONS = (
    "What colour is the shape?",
    "Is there a square?",
    "Where is the object?",
    "How big is it?",
)


# --- parallel vs sequential speculation ------------------------------------------------------


class FixedDecisionJudge(BaseChatModel):
    """Runs the real judge model (its real cost, batched) but answers from a table: random
    tiny checkpoints would route every query the same way."""

    inner: Any
    decisions: dict[str, str]
    handles_deadlines: ClassVar[bool] = True  # as the model it wraps
    accepts_image_refs: ClassVar[bool] = True

    @property
    def _llm_type(self) -> str:
        return "fixed-decision-judge"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        self.inner.invoke(messages, **kwargs)
        text = message_text(messages[-1])
        decision = next((v for k, v in self.decisions.items() if k in text), "yes")
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=decision))])


@dataclass
class SpeculationResult:
    speculation: str
    n: int
    wall_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)  # per query, from the batch start
    latency_by_route: dict[str, list[float]] = field(default_factory=dict)
    single_by_route: dict[str, list[float]] = field(default_factory=dict)  # one query at a time
    batches: dict[str, float] = field(default_factory=dict)  # model -> mean batch size
    discarded: int = 0
    routes: dict[str, int] = field(default_factory=dict)
    image_cache: dict[str, tuple[int, int]] = field(default_factory=dict)  # (hits, misses)

    @property
    def throughput(self) -> float:
        return self.n / statistics.median(self.wall_s)


def _cache_counts(model: Any) -> tuple[int, int]:
    cache = getattr(getattr(model, "processor", None), "image_processor", None)
    return getattr(cache, "hits", 0), getattr(cache, "misses", 0)


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def compare_speculation(
    make_graph: Callable[[str], Any],
    inputs: Sequence[dict],
    models: dict[str, Any],
    *,
    reps: int = 2,
    single: int = 8,
) -> dict[str, SpeculationResult]:
    """Run the same workload under both speculation settings, interleaved ``reps`` times.

    ``make_graph(speculation)`` returns the uncompiled graph; ``models`` maps a name to each
    batched model whose mean batch size is reported. ``single`` queries are also run one at
    a time (latency without batching: where max(judge, draft) shows most plainly).
    """
    settings = ("after_judge", "parallel")
    graphs = {s: make_graph(s).compile() for s in settings}
    results = {s: SpeculationResult(s, len(inputs)) for s in settings}
    for s in settings:  # warm-up
        graphs[s].batch(list(inputs[:4]), {"max_concurrency": 4})
    for _rep in range(reps):
        for s in settings:
            result = results[s]
            _cold(default_store(), *models.values())  # every run starts with cold images
            before = {
                k: (m.scheduler.stats.calls, m.scheduler.stats.requests, *_cache_counts(m))
                for k, m in models.items()
            }
            t0 = time.perf_counter()
            for _, out in graphs[s].batch_as_completed(
                list(inputs), {"max_concurrency": len(inputs)}
            ):
                latency = time.perf_counter() - t0
                result.latency_s.append(latency)
                route = out.get("route") or "failed"
                result.latency_by_route.setdefault(route, []).append(latency)
                result.routes[route] = result.routes.get(route, 0) + 1
                result.discarded += bool((out.get("draft") or {}).get("discarded"))
            result.wall_s.append(time.perf_counter() - t0)
            for k, m in models.items():
                c0, r0, h0, m0 = before[k]
                st = m.scheduler.stats
                mean = (st.requests - r0) / max(1, st.calls - c0)
                result.batches[k] = result.batches.get(k, 0.0) + mean / reps
                hits, misses = _cache_counts(m)
                h, mi = result.image_cache.get(k, (0, 0))
                result.image_cache[k] = (h + (hits - h0) // reps, mi + (misses - m0) // reps)
    for s in settings:
        for q in inputs[:single]:
            t0 = time.perf_counter()
            out = graphs[s].invoke(q)
            route = out.get("route") or "failed"
            results[s].single_by_route.setdefault(route, []).append(time.perf_counter() - t0)
    for r in results.values():
        r.routes = {k: v // reps for k, v in r.routes.items()}
        r.discarded //= reps
    return results


def speculation_report(results: dict[str, SpeculationResult]) -> str:
    """The two settings side by side."""
    a, p = results["after_judge"], results["parallel"]
    rows = [
        ("throughput (queries/s)", f"{a.throughput:.2f}", f"{p.throughput:.2f}"),
        (
            "wall, median (s)",
            f"{statistics.median(a.wall_s):.2f}",
            f"{statistics.median(p.wall_s):.2f}",
        ),
        ("latency p50 (s)", f"{_pct(a.latency_s, 0.5):.2f}", f"{_pct(p.latency_s, 0.5):.2f}"),
        ("latency p95 (s)", f"{_pct(a.latency_s, 0.95):.2f}", f"{_pct(p.latency_s, 0.95):.2f}"),
    ]
    for route in sorted(set(a.latency_by_route) | set(p.latency_by_route)):
        rows.append(
            (
                f"  {route} p50 (s)",
                f"{_pct(a.latency_by_route.get(route, []), 0.5):.2f}",
                f"{_pct(p.latency_by_route.get(route, []), 0.5):.2f}",
            )
        )
    for route in sorted(set(a.single_by_route) | set(p.single_by_route)):
        rows.append(
            (
                f"  one at a time, {route} p50 (s)",
                f"{_pct(a.single_by_route.get(route, []), 0.5):.3f}",
                f"{_pct(p.single_by_route.get(route, []), 0.5):.3f}",
            )
        )
    for k in a.batches:
        rows.append((f"mean batch, {k}", f"{a.batches[k]:.1f}", f"{p.batches.get(k, 0):.1f}"))
    for k in a.image_cache:
        (ah, am), (ph, pm) = a.image_cache[k], p.image_cache.get(k, (0, 0))
        rows.append((f"images processed / reused, {k}", f"{am} / {ah}", f"{pm} / {ph}"))
    rows.append(("drafts discarded", str(a.discarded), str(p.discarded)))
    rows.append(("routes", _routes(a.routes), _routes(p.routes)))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'after_judge':>14}  {'parallel':>14}"]
    lines += [f"{r[0]:{width}}  {r[1]:>14}  {r[2]:>14}" for r in rows]
    change = p.throughput / a.throughput - 1
    lines.append(f"parallel vs after_judge throughput: {100 * change:+.1f}%")
    return "\n".join(lines)


def _routes(routes: dict[str, int]) -> str:
    short = {"speculative": "spec", "judged-agentic": "judged", "rejected-agentic": "rejected"}
    return " ".join(f"{short.get(k, k)}:{v}" for k, v in sorted(routes.items()))
