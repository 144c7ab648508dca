"""The online gate on simulated traffic, at its defaults: for each workload (3,000 queries)
of each scenario (no drift, abrupt and gradual drift: V*-like, then HR-Bench-4K-like, then
8K-like traffic), over seeds, the three figures issue 56 asks for and
docs/calibration.md reports:

- acceptance against the best fixed tau in hindsight (at the target, per workload);
- realised risk (queries answered by an accepted draft that disagrees) against the target;
- agent calls per query (fallbacks + shadow runs), beside the hindsight tau's own fallbacks
  (no gate makes fewer calls than that without its labels).

A cold start (no evidence: the first ``warmup`` queries accept nothing) and a warm start
(500 labelled queries of the first workload's kind, as a gate file from ``speceyes
calibrate`` keeps) are both run; ``--rolling`` adds rolling risk control (the long-run
alternative, docs/calibration.md).

    python3 scripts/bench_online_gate.py [--seeds 10] [--max-risk 0.02] [--rolling STEP]
        [--shadows flat:RATE | budget:CALLS | margin:NEAR,FAR[,MARGIN] ...] [--window N]
        [--workload N] [--frontier]

``--shadows`` compares shadow policies (docs/calibration.md, "Shadow policies").
``--frontier`` prints instead what any gate that certifies its tau from one window's own
labels reaches at best on each kind of traffic, by shadow chance (docs/calibration.md,
"Agent calls").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from speceyes_graph.benchmarks.online_replay import (
    HR4K,
    HR8K,
    SCENARIOS,
    VSTAR,
    Segment,
    replay,
    simulated_evidence,
    simulated_stream,
    summarise,
)
from speceyes_graph.gate.online import (
    BudgetShadows,
    FlatShadows,
    LabelOptions,
    MarginShadows,
    OnlineGate,
    RiskOptions,
    ShadowPolicy,
    TrustOptions,
    count_upper_bound,
    default_taus,
)


def figures(
    max_risk: float,
    seeds: int,
    warm: bool,
    shadow_rate: Any = None,
    workload: int | None = None,
    **risk: Any,
) -> dict[str, dict[str, float]]:
    """Per scenario: the worst and median of each figure over its workloads and seeds. A
    workload is a segment of traffic (3,000 queries), or with ``workload`` every stretch of
    that many queries in turn, wherever the traffic changes. ``risk``: the gate's window
    settings (:class:`RiskOptions`: ``window``, ``rolling_step``)."""
    out = {}
    for name, (segments, gradual) in SCENARIOS.items():
        ratios, risks, calls, oracle = [], [], [], []
        for seed in range(seeds):
            stream = simulated_stream(segments, seed, gradual)
            evidence = simulated_evidence(segments[0], 500, seed + 10_000) if warm else None
            online = OnlineGate(
                max_risk, shadow_rate, evidence=evidence, risk=RiskOptions(**risk),
                labels=LabelOptions(seed=seed), trust=TrustOptions(store=None),
            )  # fmt: skip
            log = replay(stream, online, seed=seed)
            if workload:  # stretches of traffic: the hindsight tau is each stretch's own
                log.segment = [f"{i // workload}" for i in range(len(stream))]
                stream = [replace(q, segment=part) for q, part in zip(stream, log.segment)]
            s = summarise(stream, log, max_risk, default_taus())
            for stretch in s["segments"]:
                ratios.append(stretch["acceptance_ratio"] or 0.0)
                risks.append(stretch["risk"])
                calls.append(stretch["agent_calls"])
                oracle.append(1 - stretch["hindsight_acceptance"])
        out[name] = {
            "ratio_min": min(ratios),
            "ratio_median": float(np.median(ratios)),
            "risk_max": max(risks),
            "risk_mean": float(np.mean(risks)),
            "calls_max": max(calls),
            "calls_over_hindsight_max": max(c - o for c, o in zip(calls, oracle)),
        }
    return out


def frontier(
    segment: Segment,
    max_risk: float,
    window: int,
    chance: float,
    tolerance: float = 1.5,
    delta: float = 0.1,
    draws: int = 200,
    seed: int = 0,
) -> float:
    """The share of queries accepted by the most permissive threshold that a window of
    ``window`` queries of ``segment``'s traffic, its accepted drafts shadowed at
    ``chance``, certifies at least half the time, as the gate certifies (the unbiased
    estimate at most ``max_risk``, the exact bound at most ``tolerance * max_risk``).
    A best case: the traffic never changes, the gate already sits at that threshold, and
    the threshold is chosen knowing the traffic's score distributions exactly."""
    rng = np.random.default_rng(seed)
    for s in np.linspace(14.0, 0.0, 281):  # separability thresholds, strictest first
        share, risk = _above(segment, float(s))
        accepted, wrong = round(share * window), risk * window
        if wrong > tolerance * max_risk * window:
            break
        passed = 0
        for _ in range(draws):
            k = min(int(rng.poisson(wrong)), accepted)
            sample = int(rng.binomial(accepted, chance))
            seen = int(rng.hypergeometric(k, accepted - k, sample)) if sample else 0
            bound = count_upper_bound(np.array(seen), np.array(sample), np.array(accepted), delta)
            estimate = seen / sample * accepted if sample else 0.0
            passed += estimate <= max_risk * window and bound <= tolerance * max_risk * window
        if passed < draws / 2:
            return _above(segment, float(s) + 0.05)[0]
    return _above(segment, 0.0)[0]


def _above(segment: Segment, s: float) -> tuple[float, float]:
    """(share of queries accepted, share answered by a wrong draft) above separability s."""

    def tail(mean: float, sd: float) -> float:
        return 0.5 * math.erfc((s - mean) / (sd * math.sqrt(2)))

    right, wrong = tail(*segment.right), tail(*segment.wrong)
    accepted = segment.drafted * ((1 - segment.error) * right + segment.error * wrong)
    return accepted, segment.drafted * segment.error * wrong


def print_frontier(max_risk: float, windows: list[int]) -> None:
    chances = (0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
    print(
        f"best case of a gate certifying from one window's labels, target {max_risk}: "
        "acceptance / hindsight's, agent calls per query"
    )
    for segment in (VSTAR, HR4K, HR8K):
        grid = [_above(segment, s) for s in np.linspace(14.0, 0.0, 1401)]
        hindsight = max(a for a, r in grid if r <= max_risk)
        ceiling = max(a for a, r in grid if r <= 1.5 * max_risk)
        print(
            f"{segment.name}: hindsight accepts {hindsight:.3f} ({1 - hindsight:.2f} "
            f"fallbacks); at 1.5x the target {ceiling:.3f} ({1 - ceiling:.2f} fallbacks)"
        )
        for window in windows:
            cells = []
            for c in chances:
                a = frontier(segment, max_risk, window, c)
                cells.append(f"{c:g}: {a / hindsight:.2f}, {1 - a + c * a:.2f}")
            print(f"  window {window:>5}  " + "  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--max-risk", type=float, default=0.02)
    parser.add_argument(
        "--shadows",
        nargs="+",
        type=parse_policy,
        metavar="POLICY",
        help="shadow policies to compare (default: the gate's): flat:RATE, budget:CALLS, "
        "margin:NEAR,FAR[,MARGIN]",
    )
    parser.add_argument(
        "--rolling",
        type=float,
        metavar="STEP",
        help="also rolling risk control with this step (RiskOptions(rolling_step=STEP))",
    )
    parser.add_argument("--window", type=int, help="the gate's window (default: the gate's)")
    parser.add_argument(
        "--workload",
        type=int,
        metavar="N",
        help="figures per stretch of N queries instead of per 3,000-query segment",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="print what a gate certifying from one window's labels reaches at best",
    )
    args = parser.parse_args(argv)
    if args.frontier:
        print_frontier(args.max_risk, [args.window] if args.window else [800, 1000, 2000])
        return 0
    size = f"{args.workload:,}" if args.workload else "3,000"
    print(
        f"online gate at its defaults, target {args.max_risk}, {args.seeds} seeds, "
        f"{size}-query workloads; worst over workloads and seeds (median; for risk, mean)"
    )
    print(
        f"{'start':<6}{'scenario':<10}{'accept/hindsight':>18}{'risk/target':>14}"
        f"{'calls/query':>13}{'calls - hindsight fallbacks':>29}"
    )
    sized = {"window": args.window} if args.window else {}
    rules: list[tuple[str, dict[str, Any]]] = [("window", sized)]
    if args.shadows:
        rules = [(f"window, {p!r}", {"shadow_rate": p, **sized}) for p in args.shadows]
    if args.rolling:
        rules.append((f"rolling, step {args.rolling:g}", {"rolling_step": args.rolling, **sized}))
    for rule, gate in rules:
        print(rule)
        for warm in (False, True):
            t0 = time.perf_counter()
            found = figures(args.max_risk, args.seeds, warm, workload=args.workload, **gate)
            for name, f in found.items():
                _print_row(warm, name, f, args.max_risk)
            print(f"  ({time.perf_counter() - t0:.0f} s)")
    return 0


def parse_policy(spec: str) -> ShadowPolicy:
    """``flat:0.3``, ``budget:0.1`` or ``margin:0.6,0.1[,1.5]``."""
    kind, _, values = spec.partition(":")
    try:
        numbers = [float(v) for v in values.split(",")]
        if kind == "flat" and len(numbers) == 1:
            return FlatShadows(numbers[0])
        if kind == "budget" and len(numbers) == 1:
            return BudgetShadows(numbers[0])
        if kind == "margin" and len(numbers) in (2, 3):
            return MarginShadows(*numbers)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{spec}: {exc}") from exc
    raise argparse.ArgumentTypeError(f"{spec}: flat:RATE, budget:CALLS or margin:NEAR,FAR[,MARGIN]")


def _print_row(warm: bool, name: str, f: dict[str, float], max_risk: float) -> None:
    print(
        f"{'warm' if warm else 'cold':<6}{name:<10}"
        f"{f['ratio_min']:>10.2f} ({f['ratio_median']:.2f})"
        f"{f['risk_max'] / max_risk:>7.2f} ({f['risk_mean'] / max_risk:.2f})"
        f"{f['calls_max']:>13.2f}{f['calls_over_hindsight_max']:>29.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
