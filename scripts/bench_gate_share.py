"""One source's traffic against the online gate, with and without its share of the window
bounded (``TrustOptions(max_share=...)``): the figures docs/calibration.md ("Whose traffic")
reports.

Honest traffic is the simulation's HR-Bench-4K-like workload (``online_replay.HR4K``), each
query from one of 200 callers; one more caller sends as many queries again, interleaved:

- ``dilute``: queries its agent answers without a draft (the judge sends them to the tools;
  each costs that caller an agent run): they add to the window's queries and none to its
  disagreements, so the risk the window estimates falls while the honest traffic's does not;
- ``poison``: drafts the small model is sure of (score 0.999) and the agent contradicts:
  the gate's estimate rises at every tau and it stops accepting the honest traffic's drafts.

For each, over seeds, on the honest queries alone: the realised risk (accepted drafts that
disagree, per honest query) against the target, and the share of them accepted, beside the
same traffic with no attacker. A warm start (500 labelled queries of the workload's kind),
the gate's defaults otherwise.

    python3 scripts/bench_gate_share.py [--seeds 5] [--shares 0.05 0.01]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from speceyes_graph.benchmarks.online_replay import HR4K, simulated_evidence, simulated_stream
from speceyes_graph.gate.online import LabelOptions, OnlineGate, TrustOptions

MAX_RISK = 0.02
CALLERS = 200


def run(attack: str | None, share: float | None, seed: int) -> tuple[float, float, float]:
    """(realised risk on the honest queries, their acceptance, the final tau)."""
    gate = OnlineGate(
        MAX_RISK,
        evidence=simulated_evidence(HR4K, 500, seed + 1000),
        labels=LabelOptions(seed=seed),
        trust=TrustOptions(store=None, max_share=share),
    )
    rng = np.random.default_rng(seed)
    honest = simulated_stream([HR4K], seed)
    losses = accepted = 0
    for i, q in enumerate(honest):
        caller = gate.source(f"caller-{rng.integers(CALLERS)}", served=True)
        if q.score is None:
            gate.observe(None, None, None, source=caller)
        else:
            decision = gate.decide(q.score)
            labelled = not decision.accepted or decision.shadowed
            gate.observe(decision, q.score, q.disagrees if labelled else None, source=caller)
            accepted += decision.accepted
            losses += decision.accepted and q.disagrees
        if attack is not None:
            attacker = gate.source("mallory", served=True)
            if attack == "dilute":
                gate.observe(None, None, None, key=f"m{i}", source=attacker)
            else:
                decision = gate.decide(0.999)
                labelled = not decision.accepted or decision.shadowed
                label = True if labelled else None
                gate.observe(decision, 0.999, label, key=f"m{i}", source=attacker)
    return losses / len(honest), accepted / len(honest), gate.tau


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.01])
    args = parser.parse_args(argv)
    t0 = time.time()
    print(f"target risk {MAX_RISK}; honest traffic: {HR4K.n} queries of {CALLERS} callers")
    print(f"{'attack':<8} {'max_share':>9}  {'honest risk':>17}  {'honest acceptance':>17}  tau")
    for attack in (None, "dilute", "poison"):
        for share in (None, *args.shares) if attack else (args.shares[0],):
            rows = np.array([run(attack, share, seed) for seed in range(args.seeds)])
            risk, acceptance, tau = rows.mean(axis=0)
            print(
                f"{attack or 'none':<8} {share if share else 'none':>9}  "
                f"{risk:.4f} (max {rows[:, 0].max():.4f})  {acceptance:>17.3f}  {tau:.3f}"
            )
    print(f"({args.seeds} seeds, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
