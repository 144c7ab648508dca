"""SpecReason batched across queries vs one query at a time, on the demo checkpoints (CPU).

    python scripts/bench_specreason.py [--n 60] [--concurrency 1 64]

Prints the wall time of ``mode="specreason"`` over the same held-out demo queries at each
concurrency, and how the two models' batch workers grouped the calls (drafts on the small
model, scores and rewritten steps on the large one).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from speceyes_graph.benchmarks.runner import read_records, run_benchmark
from speceyes_graph.demo.run import demo_checkpoints, demo_graph, demo_models, demo_queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-specreason-"))
    models = demo_models(args.batch_size, demo_checkpoints())
    queries = demo_queries(out / "scenes", args.n, progress=False)
    graph = demo_graph(models["small"], models["large"], mode="specreason").compile()
    print(f"SpecReason on {args.n} demo queries, batch size {args.batch_size}")
    print(
        f"{'concurrency':>11} {'wall s':>8} {'accuracy':>9}  small: requests/batches (mean)  large: requests/batches (mean)"
    )
    for concurrency in args.concurrency:
        for model in models.values():
            model.scheduler.stats.__init__()  # count this run only
        run_dir = out / f"run-{concurrency}"
        t0 = time.perf_counter()
        run_benchmark(graph, queries, run_dir, mode="specreason", concurrency=concurrency,
                      progress=False, total=args.n)  # fmt: skip
        wall = time.perf_counter() - t0
        records = read_records(run_dir)
        accuracy = sum(r["correct"] for r in records) / len(records)
        small, large = (models[k].scheduler.stats for k in ("small", "large"))
        print(
            f"{concurrency:>11} {wall:>8.1f} {accuracy:>9.3f}  "
            f"{small.requests:>6}/{small.calls:<6} ({small.mean_batch:4.1f}){'':>9}"
            f"{large.requests:>6}/{large.calls:<6} ({large.mean_batch:4.1f})"
        )


if __name__ == "__main__":
    main()
