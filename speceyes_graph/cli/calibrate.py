"""Choosing tau and reporting on runs: calibrate (labelled or not), report, drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .bench import load_model


def _recorded_aggregation(records: list[dict]) -> str | None:
    """The aggregation of an imported run's score-only drafts (they keep the one score their
    script computed, so it is the only one), None for runs with log-probs."""
    drafts = [r["draft"] for r in records if r.get("draft")]
    if not drafts or not all(d.get("score_only") for d in drafts):
        return None
    found = {str(d.get("aggregation")) for d in drafts}
    return found.pop() if len(found) == 1 else None


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..benchmarks.runner import read_records
    from ..gate.calibration import calibrate

    records = read_records(args.dir)
    if not records:
        print(f"speceyes calibrate: no records in {args.dir}", file=sys.stderr)
        return 2
    recorded = _recorded_aggregation(records)
    if recorded == "softmax":
        print(
            f"speceyes calibrate: the drafts in {args.dir} were scored by softmax confidence "
            "(the scripts' --mode log), not separability, and keep no log-probs to score them "
            "otherwise; calibrate a run made with --mode min, mean or bottom20",
            file=sys.stderr,
        )
        return 2
    if args.aggregations is None:
        args.aggregations = recorded or "min"
    elif recorded and args.aggregations != recorded:
        print(
            f"speceyes calibrate: the drafts in {args.dir} were scored with {recorded} by the "
            "script that wrote them and keep no log-probs to aggregate otherwise; drop "
            "--aggregations",
            file=sys.stderr,
        )
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
    if cal.get("unlabelled_drafts"):
        print(
            f"{cal['unlabelled_drafts']} drafts have no recorded text, so no label (the script "
            f"that wrote the run dropped them): only taus at or above {cal['tau_floor']:.6g}, "
            "where none of them is accepted, could be certified"
        )
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
    from ..gate.label_free import NotBimodal, calibrate_unlabelled

    aggregation = args.aggregations.split(",")[0]
    try:
        result = calibrate_unlabelled(
            records,
            aggregation=aggregation,
            min_accuracy=args.min_accuracy,
            posterior=args.posterior,
            target_acceptance=args.target_acceptance,
        )
    except NotBimodal as exc:
        print(f"speceyes calibrate --unlabelled: refused: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:  # a level outside (0, 1)
        print(f"speceyes calibrate --unlabelled: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path(args.dir) / "gate.json")
    result.save(out)
    fit, cal = result.mixture, result.calibration
    (w1, w2), (m1, m2), (s1, s2) = fit["weights"], fit["means"], fit["sds"]
    print(
        f"two-component fit of {fit['n']} drafts' separability ({aggregation}): "
        f"lower {w1:.0%} at {m1:.2f} +- {s1:.2f}, upper {w2:.0%} at {m2:.2f} +- {s2:.2f} "
        f"(BIC gain {fit['delta_bic']:.1f}, Ashman's D {fit['ashman_d']:.2f})"
    )
    print(
        f"tau {result.tau:.6g} (separability {cal['tau_separability']:.3f}; {result.method}): "
        f"accepts {cal['accepted_of_drafts']:.3f} of drafts ({cal['n_accepted']})"
    )
    print(_estimate_and_labels(cal, "accepted drafts"))
    print(
        "Labels did not choose tau, so there is no guarantee: check the estimate against a "
        "labelled sample when you can"
    )
    if result.tau_depth is not None:
        if "refused" in result.depth_mixture:
            print(f"tau_depth 1.0 (no tool draft accepted): {result.depth_mixture['refused']}")
        else:
            print(
                f"tau_depth {result.tau_depth:.6g}: accepts "
                f"{result.depth_calibration['accepted_of_drafts']:.3f} of tool drafts; "
                + _estimate_and_labels(result.depth_calibration, "accepted tool drafts")
            )
    print(
        f"wrote {out} (use: speceyes bench --gate {out}; watch it: speceyes report RUN --against {out})"
    )
    return 0


def _estimate_and_labels(cal: dict[str, Any], what: str) -> str:
    """The mixture's estimate of the accepted drafts' accuracy, and what the labels say where
    the records carry any (``draft_correct``; None is unknown and not counted)."""
    modelled = cal["modelled_accuracy_of_accepted"]
    line = f"modelled accuracy of {what} " + ("-" if modelled is None else f"{modelled:.3f}")
    labelled, accepted = cal.get("labelled_of_accepted", 0), cal.get("n_accepted", 0)
    if labelled:
        line += (
            f"; labels say {cal['labelled_accuracy_of_accepted']:.3f} "
            f"({labelled} of {accepted} labelled)"
        )
    else:
        line += "; no labels to check it against"
    return line


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
    p.add_argument(
        "--aggregations",
        help="comma-separated: min,mean,bottom-q (default min; an imported run: the one its "
        "script used)",
    )
    p.add_argument("--holdout", type=float, default=0.3, help="share held out to check the gate")
    p.add_argument("--out", help="gate file to write (default: DIR/gate.json)")
    p.add_argument(
        "--unlabelled",
        action="store_true",
        help="no labels: tau from a two-component fit of the drafts' separability (refuses "
        "when it is not clearly bimodal; no guarantee, see the guide Calibrating the gate)",
    )
    rules = p.add_mutually_exclusive_group()
    rules.add_argument(
        "--min-accuracy",
        type=float,
        metavar="LEVEL",
        help="--unlabelled: the lowest tau whose accepted drafts' accuracy, as the fit "
        "estimates it, is at least LEVEL (the default rule, LEVEL 0.99; refuses when no tau "
        "reaches it). The estimate assumes Gaussian modes: see the calibration guide",
    )
    rules.add_argument(
        "--posterior",
        type=float,
        metavar="P",
        help="--unlabelled: the crossing rule instead: tau where P(upper component | score) "
        "reaches P (0.5: where the posteriors cross, balancing wrong drafts accepted against "
        "right ones rejected; higher is stricter)",
    )
    rules.add_argument(
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
