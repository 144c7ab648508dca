"""``speceyes replay-online``: run folders replayed as one production stream through the
online gate (:mod:`speceyes_graph.gate.online`)."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any


def cmd_replay_online(args: argparse.Namespace) -> int:
    from ..benchmarks.online_replay import replay, stream_from_records, summarise
    from ..benchmarks.runner import read_records
    from ..gate.online import (
        BudgetShadows,
        LabelOptions,
        MarginShadows,
        OnlineGate,
        RiskOptions,
        TrustOptions,
    )

    runs = []
    for folder in args.runs:
        records = read_records(folder)
        if not records:
            print(f"speceyes replay-online: no records in {folder}", file=sys.stderr)
            return 2
        if args.shuffle is not None:  # within each run: the runs stay in the given order
            records = list(records)
            random.Random(args.shuffle).shuffle(records)
        runs.append((Path(folder).name, records))
    stream, sources = stream_from_records(runs, aggregation=args.aggregation)
    if not any(q.score is not None for q in stream):
        print("speceyes replay-online: no gated drafts in these runs", file=sys.stderr)
        return 2
    if sum(x is not None for x in (args.shadow_rate, args.shadow_budget, args.shadow_margin)) > 1:
        print("speceyes replay-online: one shadow policy at most", file=sys.stderr)
        return 2
    shadows: Any = args.shadow_rate
    if args.shadow_budget is not None:
        shadows = BudgetShadows(args.shadow_budget)
    if args.shadow_margin is not None:
        shadows = MarginShadows(*args.shadow_margin)
    sized = {"window": args.gate_window} if args.gate_window else {}
    gate = OnlineGate(
        args.max_risk, shadows, tau=args.tau, config=args.gate,
        risk=RiskOptions(rolling_step=args.rolling, **sized),
        labels=LabelOptions(seed=args.seed), trust=TrustOptions(store=None),
    )  # fmt: skip
    log = replay(stream, gate, seed=args.seed)
    summary = summarise(stream, log, args.max_risk, list(gate.taus), window=args.window)
    summary["labels"] = sources
    summary["tolerance"], summary["shadow_policy"] = gate.tolerance, repr(gate.shadow)
    print(_table(summary, args))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "tau_path": log.tau}, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        _plot(log, args.max_risk, args.window, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def _table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    start = "a gate file's evidence" if args.gate else f"tau {args.tau or 1.0}"
    rule = (
        f"rolling risk control, step {args.rolling:g}" if args.rolling
        else f"bound at most {summary['tolerance']}x"
    )  # fmt: skip
    lines = [
        f"online gate: risk target {args.max_risk} ({rule}), "
        f"shadows {summary['shadow_policy']}, starting from {start}; labels against the "
        f"agent's answer for {summary['labels']['agent']} drafts, the reference answer for "
        f"{summary['labels']['reference']}",
        f"{'run':<28}{'queries':>8}{'accepted':>10}{'risk':>8}{'acc. err':>10}"
        f"{'fallbacks':>10}{'shadows':>9}{'tau start..end (min-max)':>28}{'hindsight':>11}",
    ]
    for part in [*summary["segments"], summary["overall"]]:
        taus = (
            f"{part['tau_start']:.3f}..{part['tau_end']:.3f} "
            f"({part['tau_min']:.3f}-{part['tau_max']:.3f})"
            if part["tau_start"] is not None
            else "-"
        )
        lines.append(
            f"{part['segment'][:27]:<28}{part['queries']:>8}{part['acceptance']:>10.3f}"
            f"{part['risk']:>8.4f}{part['accepted_error']:>10.3f}{part['fallbacks']:>10}"
            f"{part['shadows']:>9}{taus:>28}{part['hindsight_acceptance']:>11.3f}"
        )
    lines += _label_sources(summary)
    if summary.get("worst_window_risk") is not None:
        lines.append(
            f"worst risk over windows of {summary['window']} queries: "
            f"{summary['worst_window_risk']:.4f}"
        )
    lines.append(
        "risk: queries answered by an accepted draft that disagrees; hindsight: the acceptance "
        "of the best fixed tau for that run, knowing its labels"
    )
    return "\n".join(lines)


def _label_sources(summary: dict[str, Any]) -> list[str]:
    """Where a run's labels change source, said: an imported official run labels drafts the
    published tau rejected by the agent's answer (the agent ran) and those it accepted by
    the reference answer (it did not), so above that score a "disagreement" is a wrong
    draft, not a draft the agent would have answered otherwise; the risk is split too."""
    lines = []
    for part in summary["segments"]:
        labels = part["labels"]
        agent, reference = labels.get("agent"), labels.get("reference")
        if not agent or not reference:
            continue
        lines.append(
            f"  {part['segment'][:27]}: labels change source: the agent's answer for "
            f"{agent['drafts']} drafts (scores {agent['score_min']:.3f}-{agent['score_max']:.3f}"
            f", risk {agent['losses'] / part['queries']:.4f}), the reference answer for "
            f"{reference['drafts']} (scores {reference['score_min']:.3f}-"
            f"{reference['score_max']:.3f}, risk {reference['losses'] / part['queries']:.4f})"
        )
    return lines


def _plot(log: Any, max_risk: float, window: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    loss = np.asarray(log.loss, dtype=float)
    x = np.arange(1, len(loss) + 1)
    running = np.cumsum(loss) / x
    recent = (
        np.convolve(loss, np.ones(window) / window, mode="valid") if len(loss) >= window else None
    )
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(x, log.tau, lw=1)
    top.set_ylabel("tau")
    bottom.plot(x, running, label="risk so far")
    if recent is not None:
        bottom.plot(np.arange(window, len(loss) + 1), recent, label=f"last {window} queries")
    bottom.axhline(max_risk, color="red", ls="--", label="target")
    bottom.set_ylabel("realised risk")
    bottom.set_xlabel("query")
    bottom.legend()
    starts = [0] + [i for i in range(1, len(log.segment)) if log.segment[i] != log.segment[i - 1]]
    for ax in (top, bottom):
        for i in starts[1:]:
            ax.axvline(i + 1, color="grey", lw=0.5)
    for k, i in enumerate(starts):  # each run's name where it starts, staggered
        top.annotate(
            log.segment[i],
            (i + 1, 1 - 0.08 * (k % 3)),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            va="top",
            xytext=(2, -2),
            textcoords="offset points",
        )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _margin(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in (2, 3):
        raise argparse.ArgumentTypeError(f"NEAR,FAR or NEAR,FAR,MARGIN: {text!r}")
    return values


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser(
        "replay-online",
        help="replay run folders as one production stream through the online gate: risk, "
        "acceptance, agent calls and the path of tau",
    )
    p.add_argument("runs", nargs="+", help="run folders, in stream order")
    p.add_argument("--max-risk", type=float, default=0.02, help="the risk target (default 0.02)")
    p.add_argument(
        "--shadow-rate", type=float, help="a flat chance of verifying an accepted draft "
        "(default the gate's: docs/calibration.md)",
    )  # fmt: skip
    p.add_argument(
        "--shadow-budget", type=float, metavar="CALLS",
        help="shadow runs per query instead: the chance follows the gate's acceptance",
    )  # fmt: skip
    p.add_argument(
        "--shadow-margin", type=_margin, metavar="NEAR,FAR[,MARGIN]",
        help="by score instead: drafts within MARGIN (1.5) of tau in separability shadowed "
        "with chance NEAR, the rest FAR (docs/calibration.md, 'Shadow policies')",
    )  # fmt: skip
    p.add_argument(
        "--tau", type=float,
        help="where tau starts, unguarded for the warm-up (default 1.0: nothing accepted "
        "until the window certifies a tau)",
    )  # fmt: skip
    p.add_argument(
        "--gate", help="a gate file from `speceyes calibrate`: its evidence seeds the window"
    )
    p.add_argument(
        "--rolling", type=float, metavar="STEP",
        help="rolling risk control with this step instead of the window's bound "
        "(the long-run alternative, docs/calibration.md)",
    )  # fmt: skip
    p.add_argument(
        "--shuffle", type=int, metavar="SEED", help="shuffle the queries within each run"
    )
    p.add_argument("--aggregation", default="min", help="the separability aggregation (min)")
    p.add_argument(
        "--gate-window", type=int, help="queries the gate looks back on (default the gate's)"
    )
    p.add_argument("--window", type=int, default=500, help="queries per reported risk window")
    p.add_argument("--seed", type=int, default=0, help="seed of the shadow draws")
    p.add_argument("--json", help="write the summary and the tau path here")
    p.add_argument("--plot", help="write a PNG of tau and the running risk here")
    p.set_defaults(func=cmd_replay_online)
