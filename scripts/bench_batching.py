"""Cross-query batching on the tiny checkpoints (CPU): what batching and scheduling buy.

Prints, asserts nothing:
1. speculation throughput of ``graph.batch`` over N queries, batching on vs off
   (``max_batch_size=1``), with the number of ``generate`` calls;
2. per-query orchestration overhead of the graph over calling the model directly;
3. wall time of a mixed workload (some drafts accepted, some falling back to the agent
   loop) under our scheduling (every query concurrent, model calls coalesced) vs the
   published schedule (lockstep chunks of 6: judge batch, speculation batch, then the
   fallback one query at a time), on the same models and queries.

The tiny models are random, so their judge output would route nothing to speculation: the
judge here is the real large model (its ``generate`` calls are real and batched) whose
*decision* is fixed per query (3 of 4 tool-free, like the paper's beta ~0.8). tau is set
to the median draft score so about half of the drafts are accepted.

Usage: python3 scripts/bench_batching.py [--n 64] [--models DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from langchain_core.messages import SystemMessage

from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.benchmarks.throughput import FixedDecisionJudge, shape_queries
from speceyes_graph.messages import user_message
from speceyes_graph.models import ChatTransformersVLM
from speceyes_graph.prompts import (
    JUDGE_SYSTEM_PROMPT,
    JUDGE_USER_SUFFIX,
    SPECULATOR_SYSTEM_PROMPT,
    format_question,
)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def speculation_throughput(models: Path, queries: list[dict]) -> None:
    n = len(queries)
    print(f"1. speculation (mode 'small'), graph.batch over {n} queries, max_concurrency={n}")
    for label, max_batch in (("batching on ", 32), ("batching off", 1)):
        small = ChatTransformersVLM(
            model=str(models / "small"),
            top_logprobs=64,
            max_new_tokens=20,
            max_batch_size=max_batch,
            max_wait_ms=10,
        )
        graph = create_speceyes_graph(speculator=small, mode="small").compile()
        graph.batch(queries[:4], {"max_concurrency": 4})  # warm-up
        before = small.scheduler.stats.calls
        _, wall = timed(lambda g=graph: g.batch(queries, {"max_concurrency": n}))
        calls = small.scheduler.stats.calls - before
        print(f"   {label}: {wall:6.2f} s  {n / wall:6.1f} queries/s  {calls:3d} generate calls")


def orchestration_overhead(models: Path, queries: list[dict], reps: int = 16) -> None:
    small = ChatTransformersVLM(
        model=str(models / "small"), top_logprobs=64, max_new_tokens=20, max_batch_size=1
    )
    graph = create_speceyes_graph(speculator=small, mode="small").compile()
    spec = small.resize_spec
    direct_msgs = [
        [
            SystemMessage(content=SPECULATOR_SYSTEM_PROMPT),
            user_message(
                q["images"], format_question(q["question"], q["options"]) + "\nAnswer:", spec
            ),
        ]
        for q in queries[:reps]
    ]
    for m in direct_msgs[:2]:
        small.invoke(m, max_tokens=20)
    graph.invoke(queries[0])
    direct = [timed(lambda m=m: small.invoke(m, max_tokens=20))[1] for m in direct_msgs]
    through = [timed(lambda q=q: graph.invoke(q))[1] for q in queries[:reps]]
    d, g = statistics.median(direct), statistics.median(through)
    print(
        f"2. one query at a time, median of {reps}: model directly {d * 1000:.1f} ms, through the graph {g * 1000:.1f} ms "
        f"-> orchestration overhead {1000 * (g - d):.1f} ms/query (image cache warm)"
    )


def mixed_workload(models: Path, queries: list[dict], steps: int) -> None:
    small = ChatTransformersVLM(
        model=str(models / "small"),
        top_logprobs=64,
        max_new_tokens=20,
        max_batch_size=32,
        max_wait_ms=10,
    )
    large = ChatTransformersVLM(
        model=str(models / "large"), max_new_tokens=24, max_batch_size=32, max_wait_ms=10
    )
    decisions = {q["question"]: ("yes" if i % 4 == 3 else "no") for i, q in enumerate(queries)}
    judge = FixedDecisionJudge(inner=large, decisions=decisions)
    drafts = (
        create_speceyes_graph(speculator=small, mode="small", gate=GateConfig())
        .compile()
        .batch(queries, {"max_concurrency": len(queries)})
    )
    tau = float(np.median([d["draft"]["score"] for d in drafts]))
    gate = GateConfig(tau=tau)
    graph = create_speceyes_graph(
        judge=judge, speculator=small, agent=large, gate=gate, loop=LoopOptions(max_steps=steps)
    ).compile()
    print(
        f"3. mixed workload, {len(queries)} queries: 3/4 judged tool-free, tau={tau:.4f} (median draft score), "
        f"agent loop <= {steps} steps of <= 24 tokens"
    )

    def counts():
        return {
            m: (x.scheduler.stats.calls, x.scheduler.stats.requests)
            for m, x in (("small", small), ("large", large))
        }

    def batches(before, after):
        return ", ".join(
            f"{m} {after[m][0] - before[m][0]} calls (mean batch "
            f"{(after[m][1] - before[m][1]) / max(1, after[m][0] - before[m][0]):.1f})"
            for m in before
        )

    c0 = counts()
    ours, wall_ours = timed(lambda: graph.batch(queries, {"max_concurrency": len(queries)}))
    c1 = counts()

    agent_only = create_speceyes_graph(
        agent=large, mode="agent", loop=LoopOptions(max_steps=steps)
    ).compile()
    small_only = create_speceyes_graph(speculator=small, mode="small", gate=gate).compile()

    def published():
        routes = []
        for start in range(0, len(queries), 6):  # lockstep chunks of 6, as in the published scripts
            chunk = queries[start : start + 6]
            spec = large.resize_spec
            judge_msgs = [
                [
                    SystemMessage(content=JUDGE_SYSTEM_PROMPT),
                    user_message(
                        q["images"],
                        format_question(q["question"], q["options"]) + JUDGE_USER_SUFFIX,
                        spec,
                    ),
                ]
                for q in chunk
            ]
            large.batch(judge_msgs, max_tokens=10)  # one batched judge call (real cost)
            judged = [decisions[q["question"]] for q in chunk]
            free = [q for q, d in zip(chunk, judged, strict=True) if d == "no"]
            drafts = small_only.batch(free, {"max_concurrency": 6}) if free else []
            rejected = [q for q, d in zip(free, drafts, strict=True) if not d["draft"]["accepted"]]
            to_agent = [q for q, d in zip(chunk, judged, strict=True) if d == "yes"] + rejected
            for q in to_agent:  # the fallback, one query at a time
                agent_only.invoke(q)
            routes += ["speculative"] * (len(free) - len(rejected)) + ["agentic"] * len(to_agent)
        return routes

    routes, wall_pub = timed(published)
    c2 = counts()
    mix = {
        r: sum(o["route"] == r for o in ours)
        for r in ("speculative", "judged-agentic", "rejected-agentic")
    }
    print(
        f"   routes (ours): {mix}; published schedule: {routes.count('speculative')} speculative, {routes.count('agentic')} agentic"
    )
    print(
        f"   our scheduling: {wall_ours:6.2f} s   published lockstep schedule: {wall_pub:6.2f} s   -> {wall_pub / wall_ours:.2f}x"
    )
    print(f"   generate calls, our scheduling: {batches(c0, c1)}")
    print(f"   generate calls, published schedule: {batches(c1, c2)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="agent loop step bound")
    parser.add_argument(
        "--models", help="a folder from `speceyes make-tiny-models` (default: build one)"
    )
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu")
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(args.models) if args.models else None
        if models is None:
            from speceyes_graph.demo.tiny import make_tiny_models

            models = make_tiny_models(Path(tmp) / "models")["small"].parent
        qdir = Path(tmp) / "queries"
        qdir.mkdir()
        queries = shape_queries(qdir, args.n)
        speculation_throughput(models, queries)
        orchestration_overhead(models, queries)
        mixed_workload(models, queries, args.steps)


if __name__ == "__main__":
    main()
