"""Throughput against the raw model, and parallel vs sequential speculation (prints figures).

1. Ceiling ratio: for the speculation phase and the judge phase, ``graph.batch(N)`` and
   ``graph.abatch(N)`` (``--drivers``) against
   the same requests prepared and run straight through the model's batched path (same
   process, same batch size), with where the rest of the time goes.
2. ``speculation="after_judge"`` vs ``"parallel"`` on the mixed workload (judge, drafts,
   agent loops), side by side: throughput, per-query latency p50/p95 (by route, batched and
   one query at a time), mean batch size per model, discarded drafts.

Models: ``--models tiny`` (random tiny Qwen-VL checkpoints; the judge's real cost with a
fixed 3-in-4 tool-free decision, tau at the median draft score) or ``--models demo`` (the
shipped demo checkpoints, their own decisions), or both (default).

Usage: python3 scripts/bench_throughput.py [--n 64] [--reps 3] [--models tiny demo]
                                           [--parts ceiling speculation]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from speceyes_graph import GateConfig, create_speceyes_graph
from speceyes_graph.benchmarks.throughput import (
    FixedDecisionJudge,
    ceiling,
    compare_speculation,
    shape_queries,
    speculation_report,
)
from speceyes_graph.models import ChatTransformersVLM


def setup(kind: str, folder: Path, n: int, batch: int):
    """(small, large, queries, graph settings, make_graph for the mixed workload)."""
    if kind == "demo":
        from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models, demo_queries

        models = demo_models(batch_size=batch)
        queries = [
            {"question": q.question, "images": [q.image], "options": q.options}
            for q in demo_queries(folder, n, seed=11)
        ]

        def make_graph(speculation: str):
            return create_speceyes_graph(
                speculator=models["small"],
                agent=models["large"],
                speculation=speculation,
                **DEMO_GRAPH_SETTINGS,
            )

        return models["small"], models["large"], queries, DEMO_GRAPH_SETTINGS, make_graph

    from speceyes_graph.demo.tiny import cached_tiny_models

    paths = cached_tiny_models()
    small = ChatTransformersVLM(
        model=str(paths["small"]), top_logprobs=64, max_new_tokens=20, max_batch_size=batch
    )
    large = ChatTransformersVLM(model=str(paths["large"]), max_new_tokens=24, max_batch_size=batch)
    queries = shape_queries(folder, n)
    decisions = {q["question"]: ("yes" if i % 4 == 3 else "no") for i, q in enumerate(queries)}
    drafts = (
        create_speceyes_graph(speculator=small, mode="small")
        .compile()
        .batch(queries, {"max_concurrency": n})
    )
    tau = float(np.median([d["draft"]["score"] for d in drafts]))

    def make_graph(speculation: str):
        judge = FixedDecisionJudge(inner=large, decisions=decisions)
        return create_speceyes_graph(
            judge=judge,
            speculator=small,
            agent=large,
            gate=GateConfig(tau=tau),
            max_agent_steps=3,
            speculation=speculation,
        )

    return small, large, queries, {}, make_graph


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size of each model")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=["tiny", "demo"], default=["tiny", "demo"])
    parser.add_argument(
        "--parts", nargs="+", choices=["ceiling", "speculation"], default=["ceiling", "speculation"]
    )
    parser.add_argument(
        "--drivers", nargs="+", choices=["batch", "abatch"], default=["batch", "abatch"]
    )
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models:
            folder = Path(tmp) / kind
            folder.mkdir()
            small, large, queries, settings, make_graph = setup(kind, folder, args.n, args.batch)
            print(f"\n=== {kind} checkpoints, N={args.n}, batch size {args.batch} ===")
            if "ceiling" in args.parts:
                for phase in ("speculation", "judge"):
                    for driver in args.drivers:
                        result = ceiling(
                            phase,
                            small=small,
                            large=large,
                            queries=queries,
                            reps=args.reps,
                            graph_settings=settings,
                            driver=driver,
                        )
                        print(result.report())
            if "speculation" in args.parts:
                results = compare_speculation(
                    make_graph,
                    queries,
                    {"small": small, "large": large},
                    reps=max(1, args.reps - 1),
                )
                print(f"mixed workload, {args.n} queries at concurrency {args.n}:")
                print(speculation_report(results))


if __name__ == "__main__":
    main()
