"""How the online gate keeps its promise on simulated traffic: realised risk over windows
and acceptance against the best fixed tau in hindsight, with no drift, abrupt drift and
gradual drift (V*-like, then HR-Bench-4K-like, then 8K-like traffic), over many seeds. The
tolerance and the factor in docs/calibration.md are the worst this prints.

    python3 scripts/bench_online_gate.py [--seeds 20] [--max-risk 0.02] [--shadow-rate 0.1]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from speceyes_graph.benchmarks.online_replay import (
    SCENARIOS,
    replay,
    simulated_stream,
    summarise,
)
from speceyes_graph.online_gate import OnlineGate, default_taus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-risk", type=float, default=0.02)
    parser.add_argument("--shadow-rate", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=1000, help="queries per scored window")
    args = parser.parse_args(argv)
    print(
        f"target {args.max_risk}, shadow rate {args.shadow_rate}, {args.seeds} seeds; "
        f"risk over windows of {args.window} queries"
    )
    print(
        f"{'scenario':<10}{'risk/segment max':>18}{'worst window':>14}{'mean window':>13}"
        f"{'accept/hindsight min':>22}{'median':>8}{'shadows/query':>15}"
    )
    for name, (segments, gradual) in SCENARIOS.items():
        worst, means, seg_risk, ratios, shadows = [], [], [], [], []
        for seed in range(args.seeds):
            stream = simulated_stream(segments, seed, gradual)
            gate = OnlineGate(args.max_risk, args.shadow_rate, seed=seed)
            log = replay(stream, gate, seed=seed)
            s = summarise(stream, log, args.max_risk, default_taus(), window=args.window)
            worst.append(s["worst_window_risk"])
            means.append(float(np.mean(s["window_risks"])))
            seg_risk += [p["risk"] for p in s["segments"]]
            ratios += [p["acceptance_ratio"] for p in s["segments"] if p["acceptance_ratio"]]
            shadows.append(s["overall"]["shadows"] / s["overall"]["queries"])
        print(
            f"{name:<10}{max(seg_risk):>18.4f}{max(worst):>14.4f}{np.mean(means):>13.4f}"
            f"{min(ratios):>22.2f}{np.median(ratios):>8.2f}{np.mean(shadows):>15.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
