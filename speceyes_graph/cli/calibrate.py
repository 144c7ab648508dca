"""Choosing tau and reporting on runs: calibrate (labelled or not), report, drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .bench import load_model


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..benchmarks.runner import read_records
    from ..calibration import calibrate

    records = read_records(args.dir)
    if not records:
        print(f"speceyes calibrate: no records in {args.dir}", file=sys.stderr)
        return 2
    if args.unlabelled:
        return _calibrate_unlabelled(args, records)
    if args.max_drop is None:
        print("speceyes calibrate: --max-drop EPS is needed (or --unlabelled)", file=sys.stderr)
        return 2
    baseline = read_records(args.baseline) if args.baseline else None
    result = calibrate(
        records,
        max_drop=args.max_drop,
        delta=args.delta,
        baseline=baseline,
        aggregations=args.aggregations.split(","),
        holdout=args.holdout,
    )
    out = Path(args.out or Path(args.dir) / "gate.json")
    result.save(out)
    cal, held = result.calibration, result.holdout
    assert result.delta is not None  # calibrate() keeps its delta (only label-free has none)
    print(
        f"tau {result.tau:.6g} ({result.aggregation}, K {result.k}): with probability >= "
        f"{1 - result.delta:.3g}, accepted drafts cost at most {result.max_drop:.3g} accuracy "
        f"({result.loss}; {result.method}; {result.n_calibration} calibration queries)"
    )
    print(f"calibration: accepts {cal['accepted']:.3f} of queries, observed loss {cal['risk']:.4f}")
    if held:
        line = f"held out ({held['n']} queries): accepts {held['accepted']:.3f}, observed loss {held['risk']:.4f}"
        if "accuracy_with_gate" in held:
            line += f", accuracy {held['accuracy_with_gate']:.3f} vs agent-only {held['agent_accuracy']:.3f}"
        print(line)
    if result.tau >= 1.0:
        print("no tau could be certified at this level: the gate file accepts no draft")
    if result.tau_depth is not None:
        dc = result.depth_calibration
        print(
            f"tau_depth {result.tau_depth:.6g} (the answers after the small model's tool steps, "
            f"same guarantee): accepts {dc['accepted']:.3f} of queries, observed loss {dc['risk']:.4f}"
        )
    print(f"wrote {out} (use: speceyes bench --gate {out}, or create_speceyes_graph(gate=...))")
    return 0


def _calibrate_unlabelled(args: argparse.Namespace, records: list[dict]) -> int:
    from ..label_free import NotBimodal, calibrate_unlabelled

    aggregation = args.aggregations.split(",")[0]
    try:
        result = calibrate_unlabelled(
            records,
            aggregation=aggregation,
            posterior=args.posterior,
            target_acceptance=args.target_acceptance,
        )
    except NotBimodal as exc:
        print(f"speceyes calibrate --unlabelled: refused: {exc}", file=sys.stderr)
        return 3
    out = Path(args.out or Path(args.dir) / "gate.json")
    result.save(out)
    fit, cal = result.mixture, result.calibration
    (w1, w2), (m1, m2), (s1, s2) = fit["weights"], fit["means"], fit["sds"]
    print(
        f"two-component fit of {fit['n']} drafts' separability ({aggregation}): "
        f"lower {w1:.0%} at {m1:.2f} +- {s1:.2f}, upper {w2:.0%} at {m2:.2f} +- {s2:.2f} "
        f"(BIC gain {fit['delta_bic']:.1f}, Ashman's D {fit['ashman_d']:.2f})"
    )
    modelled = cal["modelled_accuracy_of_accepted"]
    print(
        f"tau {result.tau:.6g} (separability {cal['tau_separability']:.3f}; {result.method}): "
        f"accepts {cal['accepted_of_drafts']:.3f} of drafts"
        + (f", modelled accuracy of those {modelled:.3f}" if modelled is not None else "")
        + ". No labels, no guarantee: check it against a labelled sample when you can"
    )
    if result.tau_depth is not None:
        if "refused" in result.depth_mixture:
            print(f"tau_depth 1.0 (no tool draft accepted): {result.depth_mixture['refused']}")
        else:
            print(
                f"tau_depth {result.tau_depth:.6g}: accepts "
                f"{result.depth_calibration['accepted_of_drafts']:.3f} of tool drafts"
            )
    print(
        f"wrote {out} (use: speceyes bench --gate {out}; watch it: speceyes report RUN --against {out})"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..benchmarks.report import write_report

    judge = None
    if args.judge_model:
        from ..models.specs import SpecError, parse_model_spec

        try:
            spec = parse_model_spec(args.judge_model, "judge")
        except SpecError as exc:
            print(f"speceyes report: --judge-model: {exc}", file=sys.stderr)
            return 2
        judge = load_model(spec, "judge", top_logprobs=None, max_new_tokens=16, batch_size=8)
    report = write_report(
        args.dir,
        args.baseline,
        args.out,
        scoring=args.scoring,
        judge=judge,
        compare=args.compare,
        against=args.against,
        drift_level=args.drift_level,
    )
    out = Path(args.out or args.dir)
    print((out / "report.md").read_text())
    print(
        f"wrote {out / 'report.md'}, {out / 'report.json'}"
        + "".join(f", {out / p}" for p in report["plots"])
    )
    for warning in (report.get("drift") or {}).get("warnings", []):
        print(f"speceyes report: warning: {warning}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser(
        "calibrate",
        help="choose tau from a labelled run so accepted drafts cost at most EPS accuracy, "
        "with probability at least 1-DELTA",
    )
    p.add_argument("dir", help="a run with drafts (--mode small or speceyes)")
    p.add_argument("--max-drop", type=float, help="EPS, e.g. 0.01 (labelled calibration)")
    p.add_argument("--delta", type=float, default=0.1, help="DELTA, e.g. 0.1")
    p.add_argument("--baseline", help="an agent-only run of the same queries (tighter loss)")
    p.add_argument("--aggregations", default="min", help="comma-separated: min,mean,bottom-q")
    p.add_argument("--holdout", type=float, default=0.3, help="share held out to check the gate")
    p.add_argument("--out", help="gate file to write (default: DIR/gate.json)")
    p.add_argument(
        "--unlabelled",
        action="store_true",
        help="no labels: tau from a two-component fit of the drafts' separability (refuses "
        "when it is not clearly bimodal; no guarantee, see the guide Reproducing the paper)",
    )
    p.add_argument(
        "--posterior",
        type=float,
        default=0.5,
        help="--unlabelled: tau where P(upper component | score) reaches this (default 0.5: "
        "where the posteriors cross; higher is stricter)",
    )
    p.add_argument(
        "--target-acceptance",
        type=float,
        help="--unlabelled: tau that accepts this share of the drafts instead",
    )
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("report", help="summarise a run, sweep tau offline against a baseline, plot")
    p.add_argument("dir")
    p.add_argument("--baseline", help="an agent-only run of the same queries")
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="RUN",
        help="other runs of the same queries (small only, SpecReason, ...): a methods table",
    )
    p.add_argument("--out", help="where to write (default: DIR)")
    p.add_argument(
        "--scoring",
        choices=["strict", "official"],
        default="strict",
        help="strict: this package's answer reading (unreadable = wrong); official: the "
        "published matching rules",
    )
    p.add_argument(
        "--judge-model",
        help="an LLM grader for answers the rules cannot decide, with the published grader "
        "prompt (the paper used openai:URL#Qwen/Qwen2.5-72B-Instruct); any model spec",
    )
    p.add_argument(
        "--against",
        metavar="GATEFILE",
        help="a gate file from `speceyes calibrate`: test whether this run's drafts still look "
        "like the calibration ones (Kolmogorov-Smirnov, acceptance) and warn when they moved",
    )
    p.add_argument(
        "--drift-level",
        type=float,
        default=0.01,
        help="--against: warn below this p-value (default 0.01: one false alarm in a hundred "
        "checks of unchanged traffic; lower it for checks that run often)",
    )
    p.set_defaults(func=cmd_report)
