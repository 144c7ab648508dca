"""The published evaluation's schedule, so the paper's speedup can be reproduced.

The SpecEyes scripts process queries in lockstep chunks (6 by default): the large model
judges the whole chunk in one batch, the small model drafts for the tool-free part of it in
one batch, and then every query that needs the agent (judged agentic first, then rejected
drafts, in chunk order) runs the tool loop **one at a time**; the next chunk starts when
all of that is done. Their baseline is the same loop without the judge: every query through
the agent, one at a time. The paper's speedup is the baseline's wall time per query over
the method's.

This package's own schedule (``--schedule concurrent``) overlaps everything and batches
across queries; its speedups are not comparable with the paper's. Here the same graph runs
on the published schedule: a checkpointer and interrupts before ``speculate`` and
``agent_loop`` give the phase barriers, so judge, draft, gate and agent are the very nodes
the concurrent schedule runs.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import put_bytes, release

from ..state import SpecEyesContext, SpecEyesInput, SpecEyesOutput, SpecEyesState
from .datasets import BenchQuery
from .runner import make_record

__all__ = ["OfficialSchedule"]


class OfficialSchedule:
    """Runs one chunk of queries the way the published scripts do; returns their records."""

    def __init__(
        self,
        graph: StateGraph[SpecEyesState, SpecEyesContext, SpecEyesInput, SpecEyesOutput],
        mode: str,
        chunk_size: int = 6,
    ):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        self.mode, self.chunk_size = mode, chunk_size
        self.saver = InMemorySaver()
        self.app = graph.compile(
            checkpointer=self.saver,
            interrupt_before=["speculate", "agent_loop"] if mode == "speceyes" else None,
        )

    def __call__(self, chunk: list[BenchQuery]) -> list[dict]:
        start = time.perf_counter()
        refs: list[str | None] = []
        inputs = []
        configs: list[RunnableConfig] = []
        for i, q in enumerate(chunk):
            ref = q.image or (put_bytes(q.image_bytes()) if q.image_bytes else None)
            refs.append(ref)
            inputs.append(
                {"question": q.question, "images": [ref] if ref else [], "options": q.options}
            )
            configs.append({"configurable": {"thread_id": f"official-{i}-{q.id}"}})
        finished: dict[int, float] = {}
        errors: dict[int, str] = {}
        try:
            if self.mode in ("agent", "specreason"):  # published baselines: one at a time
                for i in range(len(chunk)):
                    self._invoke(i, inputs[i], configs, errors)
                    finished[i] = time.perf_counter()
            elif self.mode == "small":
                self._batch(range(len(chunk)), inputs, configs, errors)
                finished.update(dict.fromkeys(range(len(chunk)), time.perf_counter()))
            else:
                self._speceyes(inputs, configs, errors, finished)
            records = []
            for i, q in enumerate(chunk):
                out = self.app.get_state(configs[i]).values
                done = finished.get(i, time.perf_counter())
                records.append(make_record(q, out, done - start, errors.get(i), self.mode))
            return records
        finally:
            for config, ref in zip(configs, refs, strict=True):
                self.saver.delete_thread(config["configurable"]["thread_id"])
                if ref and is_blob_key(ref):
                    release(ref)

    def _speceyes(self, inputs, configs, errors, finished) -> None:
        everyone = range(len(inputs))
        self._batch(everyone, inputs, configs, errors)  # phase I: one batched judge call
        waiting = {i: self.app.get_state(configs[i]).next for i in everyone if i not in errors}
        free = [i for i, nxt in waiting.items() if nxt == ("speculate",)]
        judged = [i for i, nxt in waiting.items() if nxt == ("agent_loop",)]
        now = time.perf_counter()
        finished.update({i: now for i, nxt in waiting.items() if not nxt})  # failed in intake
        self._batch(free, [None] * len(inputs), configs, errors)  # phase II-III: one draft batch
        now = time.perf_counter()
        rejected = []
        for i in free:
            if i in errors or not self.app.get_state(configs[i]).next:
                finished[i] = now
            else:
                rejected.append(i)
        for i in judged + rejected:  # phase IV: the fallback, one query at a time
            self._invoke(i, None, configs, errors)
            finished[i] = time.perf_counter()

    def _batch(self, indices, inputs, configs, errors) -> None:
        indices = [i for i in indices if i not in errors]
        if not indices:
            return
        outs = self.app.batch(
            [inputs[i] for i in indices],
            [{**configs[i], "max_concurrency": len(indices)} for i in indices],
            return_exceptions=True,
        )
        for i, out in zip(indices, outs, strict=True):
            if isinstance(out, Exception):
                errors[i] = f"{type(out).__name__}: {out}"

    def _invoke(self, i: int, value: Any, configs, errors) -> None:
        try:
            self.app.invoke(value, configs[i])
        except Exception as exc:
            errors[i] = f"{type(exc).__name__}: {exc}"
