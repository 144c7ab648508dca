"""Reports from runner records: accuracy, latency, speedup, the funnel, offline tau sweeps.

Every draft keeps its sorted top-K log-probs, so the gate can be re-run offline at any tau
and aggregation without touching a model: a query's outcome is the draft's correctness if
the draft would be accepted, else the agent's correctness from the baseline run; its
modelled latency is its judge and draft time plus, if rejected, the agent's latency from
the baseline run. (Modelled latency is the paper's per-query cost model, not a wall-clock
throughput measurement; the achieved speedup of a real run is reported beside it.)
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..gate.calibration import gate_drift
from . import plots
from .draft_scores import auroc, draft_token_scores
from .official import grade, official_reference, official_rule
from .online_report import online_lines, online_path
from .runner import read_records, run_settings
from .scoring import extract_choice, extract_yes_no, pope_metrics
from .sweep import TAUS, sweep

__all__ = [
    "DEFINITIONS",
    "auroc",
    "build_report",
    "draft_token_scores",
    "rescore",
    "sweep",
    "write_report",
]

DEFINITIONS = {
    "beta": "share of queries the judge (the large model) sent to the small model as tool-free",
    "alpha": "share of those tool-free queries whose draft passed the gate (answered by the small model)",
    "separability": "per generated token, (top-1 logit - mean of the other top-K) / their std; "
    "min over the answer's tokens",
    "tau": "the gate's threshold: a draft is accepted when sigmoid(0.6 x separability) > tau",
    "speedup_wall": "measured: the baseline's wall time per query / this run's (the paper's "
    "definition; compare with the paper only when both runs used --schedule official)",
    "speedup_latency": "measured: the baseline's mean per-query latency / this run's",
    "ideal_speedup": "cost model 1 / (1 - beta x alpha): judge and draft free, every agent run "
    "as long; an estimate, not a bound (batching and concurrency can beat it)",
    "speedup_modelled": "the offline sweep's cost model at this run's tau: per query, judge + "
    "draft + (if rejected) the baseline's latency for that query",
    "auroc": "how well separability ranks the small model's right drafts above its wrong ones "
    "(1 perfect, 0.5 chance), over its drafts on every query",
    "alpha_depth": "share of the tool-needing queries (the judge asked for tools) that the small "
    "model's own tool loop answered and its gate (tau_depth) accepted: depth-D speculation",
    "expected_latency_s": "extended cost model E[L] = c_J + beta c_S + (1 - beta) c_S^D + (1 - "
    "beta alpha - (1 - beta) alpha_D) L_agent, with this run's mean judge, draft, small-loop and "
    "agent-loop times",
    "speedup_cost_model": "L_agent / E[L]: the agent-only latency the cost model predicts over "
    "this run's, beside the measured speedups",
    "accuracy": "correct / all queries; an errored query counts as wrong",
    "accuracy_errors_dropped": "correct / queries without error (the published scripts' "
    "denominator)",
}


def _model_name(model: Any) -> str | None:
    """A stable name for a chat model (the cache key of its verdicts)."""
    if model is None:
        return None
    return str(
        getattr(model, "model_name", None) or getattr(model, "model", None) or type(model).__name__
    )


def _strict(record: dict, text: str | None) -> bool | None:
    """Our scoring; None when the reply cannot be read (a judge may decide)."""
    if record.get("options"):
        choice = extract_choice(text, record["options"])
        return None if choice is None else choice == record["expected"]
    said = extract_yes_no(text)
    return None if said is None else said == record["expected"].lower()


def rescore(
    records: list[dict],
    benchmark: str,
    scoring: str = "strict",
    judge: Any = None,
    cache: Path | None = None,
) -> tuple[list[dict], dict[str, int]]:
    """Records with ``correct`` and ``draft_correct`` decided by ``strict`` (this package's
    rules) or ``official`` (the published rules); what the rules cannot decide goes to
    ``judge`` (any chat model, with the published grader prompt) or counts as wrong.
    Judge verdicts are cached in ``cache`` (a JSON-lines file), so a rerun costs nothing."""
    if scoring not in ("strict", "official"):
        raise ValueError(f"scoring must be 'strict' or 'official', got {scoring!r}")
    if scoring == "strict" and judge is None:
        return records, {}  # the runner scored every record this way already
    verdicts: dict[str, bool] = {}
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            try:
                entry = json.loads(line)
                verdicts[entry["key"]] = bool(entry["correct"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    stats: Counter[str] = Counter()
    grader = benchmark if benchmark in ("vstar", "hrbench", "pope", "synthetic") else "vstar"
    judge_name = _model_name(judge)

    def decide(record: dict, text: str | None) -> bool:
        if scoring == "official":
            verdict = official_rule(grader, text, record["expected"], record.get("options"))
        else:
            verdict = _strict(record, text)
        if verdict is not None:
            return verdict
        stats["undecided"] += 1
        if judge is None or not text:
            return False
        reference = official_reference(grader, record["expected"], record.get("options"))
        key = hashlib.sha1(
            json.dumps([grader, judge_name, record["question"], reference, text]).encode()
        ).hexdigest()
        if key not in verdicts:
            verdicts[key] = grade(judge, grader, record["question"], reference, text)
            stats["judged"] += 1
            if cache is not None:
                with cache.open("a") as fh:
                    fh.write(json.dumps({"key": key, "correct": verdicts[key]}) + "\n")
        return verdicts[key]

    out = []
    for r in records:
        r = dict(r)
        r["correct"] = r.get("error") is None and decide(r, r.get("answer"))
        draft = r.get("draft") or {}
        if draft.get("score_only") and draft.get("text") is None:
            r["draft_correct"] = None  # an imported draft whose text its script dropped
        else:
            r["draft_correct"] = bool(draft.get("text")) and decide(r, draft.get("text"))
        out.append(r)
    return out, dict(stats)


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _summary(records: list[dict], wall: float | None) -> dict[str, Any]:
    n = len(records)
    lat = [r["latency_s"] for r in records if r.get("latency_s") is not None]
    routes = Counter(r.get("route") or "error" for r in records)
    by_split: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_split[r["split"]].append(r)
    splits = {}
    for split, rs in sorted(by_split.items()):
        entry: dict[str, Any] = {"n": len(rs), "accuracy": sum(r["correct"] for r in rs) / len(rs)}
        if not rs[0].get("options"):  # yes/no task: POPE metrics
            m = pope_metrics(
                (extract_yes_no(r.get("answer")) if not r.get("error") else None, r["expected"])
                for r in rs
            )
            entry.update(
                precision=m.precision,
                recall=m.recall,
                f1=m.f1,
                yes_ratio=m.yes_ratio,
                unreadable=m.unreadable,
            )
        splits[split] = entry
    tool_needing = routes["judged-agentic"] + routes["speculative-tools"]
    tool_free = routes["speculative"] + routes["rejected-agentic"]
    judged = tool_free + tool_needing
    beta = tool_free / judged if judged else None
    alpha = routes["speculative"] / tool_free if tool_free else None
    ideal = (
        1 / (1 - beta * alpha)
        if beta is not None and alpha is not None and beta * alpha < 1
        else None
    )
    errors = sum(1 for r in records if r.get("error"))
    return {
        "n": n,
        "accuracy": sum(r["correct"] for r in records) / n if n else 0.0,
        "accuracy_errors_dropped": (
            sum(r["correct"] for r in records if not r.get("error")) / (n - errors)
            if n > errors
            else None
        ),
        "errors": errors,
        "routes": dict(routes),
        "splits": splits,
        "latency_mean_s": float(np.mean(lat)) if lat else None,
        "latency_p50_s": _percentile(lat, 50),
        "latency_p95_s": _percentile(lat, 95),
        "wall_s": wall,
        "throughput_qps": n / wall if wall else None,
        "beta": beta,
        "alpha": alpha,
        "ideal_speedup": ideal,
        **_depth_summary(records, routes, beta, alpha),
    }


def _mean_timing(records: list[dict], phase: str) -> float | None:
    values = [r["timings"][phase] for r in records if phase in (r.get("timings") or {})]
    return float(np.mean(values)) if values else None


def _depth_summary(
    records: list[dict], routes: Counter, beta: float | None, alpha: float | None
) -> dict[str, Any]:
    """Depth-D speculation's figures (only for runs that used it): alpha_D, what the small
    loop did, and the extended cost model (see DEFINITIONS) beside the measured speedups."""
    tried = [r for r in records if r.get("tool_draft")]
    if not tried:
        return {}
    steps = [len(r["tool_draft"].get("steps") or []) for r in tried]
    tool_needing = routes["judged-agentic"] + routes["speculative-tools"]
    alpha_d = routes["speculative-tools"] / tool_needing if tool_needing else None
    costs = {
        "c_judge_s": _mean_timing(records, "judge"),
        "c_draft_s": _mean_timing(records, "speculate"),
        "c_small_loop_s": _mean_timing(records, "speculate_tools"),
        "l_agent_s": _mean_timing(records, "agent"),
    }
    expected: float | None = None
    speedup: float | None = None
    c_judge, c_loop, l_agent = costs["c_judge_s"], costs["c_small_loop_s"], costs["l_agent_s"]
    if (
        beta is not None
        and alpha_d is not None
        and c_judge is not None
        and c_loop is not None
        and l_agent is not None
    ):
        a = alpha or 0.0
        expected = (
            c_judge
            + beta * (costs["c_draft_s"] or 0.0)
            + (1 - beta) * c_loop
            + (1 - beta * a - (1 - beta) * alpha_d) * l_agent
        )
        speedup = l_agent / expected if expected else None
    accepted = [r for r in tried if r["tool_draft"].get("accepted")]
    return {
        "speculation_depth": max(int(r["tool_draft"].get("depth") or 0) for r in tried),
        "alpha_depth": alpha_d,
        "small_loop": {
            "queries": len(tried),
            "accepted": len(accepted),
            "accepted_correct": sum(bool(r.get("correct")) for r in accepted),
            "mean_steps": float(np.mean(steps)),
            "failed": sum(1 for r in tried if r["tool_draft"].get("error")),
        },
        "cost_model": {
            **costs,
            "expected_latency_s": expected,
            "speedup_cost_model": speedup,
        },
    }


def _wall(run_dir: Path) -> float | None:
    path = run_dir / "run.json"
    if not path.exists():
        return None
    return (
        sum(s.get("wall_s", 0.0) for s in json.loads(path.read_text()).get("sessions", [])) or None
    )


def _scored_run(run_dir: Path, scoring: str, judge: Any) -> tuple[dict, str, list, dict, dict]:
    """(settings, benchmark, rescored records, scoring stats, summary) of one run folder."""
    records = read_records(run_dir)
    if not records:
        raise FileNotFoundError(f"no records in {run_dir}")
    settings = run_settings(run_dir)
    benchmark = settings.get("benchmark") or ("vstar" if records[0].get("options") else "pope")
    records, stats = rescore(records, benchmark, scoring, judge, run_dir / "grades.jsonl")
    return settings, benchmark, records, stats, _summary(records, _wall(run_dir))


def build_report(
    run_dir: str | Path,
    baseline_dir: str | Path | None = None,
    *,
    scoring: str = "strict",
    judge: Any = None,
    against: str | Path | None = None,
    drift_level: float = 0.01,
) -> dict[str, Any]:
    """The report of one run; ``against``: a gate file whose calibration distribution the
    run's drafts are tested against (drift, warnings below ``drift_level``)."""
    run_dir = Path(run_dir)
    settings, benchmark, records, stats, summary = _scored_run(run_dir, scoring, judge)
    summary.update(
        schedule=settings.get("schedule", "concurrent"),
        tau=settings.get("threshold"),
        aggregation=settings.get("aggregation"),
    )
    report: dict[str, Any] = {
        "run": str(run_dir),
        "benchmark": benchmark,
        "scoring": {"mode": scoring, "judge": _model_name(judge), **stats},
        "summary": summary,
        "definitions": DEFINITIONS,
    }
    baseline: list[dict] = []
    if baseline_dir is not None:
        baseline_dir = Path(baseline_dir)
        baseline, base_stats = rescore(
            read_records(baseline_dir), benchmark, scoring, judge, baseline_dir / "grades.jsonl"
        )
        base_summary = _summary(baseline, _wall(baseline_dir))
        base_summary["schedule"] = run_settings(baseline_dir).get("schedule", "concurrent")
        report["baseline"] = {"run": str(baseline_dir), "summary": base_summary}
        s = summary
        if s["latency_mean_s"] and base_summary["latency_mean_s"]:
            s["speedup_latency"] = base_summary["latency_mean_s"] / s["latency_mean_s"]
        if s["throughput_qps"] and base_summary["throughput_qps"]:
            s["speedup_wall"] = s["throughput_qps"] / base_summary["throughput_qps"]
        if s["schedule"] != base_summary["schedule"]:
            report["warnings"] = [
                f"this run used the {s['schedule']} schedule and the baseline the "
                f"{base_summary['schedule']} one: speedup_wall compares different schedules"
            ]
        report["sweep"] = sweep(records, baseline)
        curve = (report["sweep"].get("curves") or {}).get(
            f"separability:{s['aggregation'] or 'min'}"
        )
        if curve and s["tau"] is not None:
            at = min(curve, key=lambda c: abs(c["tau"] - s["tau"]))
            s["speedup_modelled"] = at["speedup"]
    agent_answers = {r["id"]: r.get("answer") for r in baseline if not r.get("error")}
    online = online_path(records, settings.get("max_risk"), agent_answers)
    if online is not None:
        report["online_gate"] = online
    if against is not None:
        report["drift"] = gate_drift(records, against, drift_level)
        report.setdefault("warnings", []).extend(report["drift"]["warnings"])
    report["_records"] = records
    return report


METHOD_NAMES = {
    "agent": "agent only",
    "small": "small model only (draft, no fallback)",
    "specreason": "SpecReason",
    "speceyes": "SpecEyes",
}


def compare_methods(
    run_dirs: Sequence[str | Path],
    baseline_dir: str | Path | None = None,
    *,
    scoring: str = "strict",
    judge: Any = None,
) -> list[dict[str, Any]]:
    """One row per run (agent only, small only, SpecReason, SpecEyes...): accuracy, latency,
    throughput and speedups over the baseline run, as the paper's main table lays them out."""
    rows = []
    dirs = [Path(d) for d in ([baseline_dir] if baseline_dir else []) + list(run_dirs)]
    base: dict[str, Any] | None = None
    for d in dict.fromkeys(dirs):
        settings, _, records, _, s = _scored_run(d, scoring, judge)
        mode = settings.get("mode") or records[0].get("mode")
        row = {
            "run": str(d),
            "method": METHOD_NAMES.get(mode, mode or "?"),
            "mode": mode,
            "tools": settings.get("tools"),
            "tau": settings.get("threshold") if mode == "speceyes" else None,
            **{k: s[k] for k in ("n", "accuracy", "errors", "latency_mean_s", "throughput_qps")},
        }
        if base is None and baseline_dir is not None:
            base = row
        if base is not None:
            if row["latency_mean_s"] and base["latency_mean_s"]:
                row["speedup_latency"] = base["latency_mean_s"] / row["latency_mean_s"]
            if row["throughput_qps"] and base["throughput_qps"]:
                row["speedup_wall"] = row["throughput_qps"] / base["throughput_qps"]
        rows.append(row)
    return rows


def methods_table(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a markdown table."""
    lines = [
        "| method | tools | tau | n | accuracy | errors | mean latency (s) | throughput (q/s) "
        "| speedup (throughput) | speedup (latency) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r.get('tools') or '-'} | {_fmt(r.get('tau'), 'g')} | {r['n']} "
            f"| {_fmt(r['accuracy'])} | {r['errors']} | {_fmt(r['latency_mean_s'])} "
            f"| {_fmt(r['throughput_qps'])} | {_fmt(r.get('speedup_wall'), '.2f')}x "
            f"| {_fmt(r.get('speedup_latency'), '.2f')}x |"
        )
    return "\n".join(lines) + "\n"


def _fmt(v: Any, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _drift_lines(drift: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## Drift against `{drift['gate_file']}`",
        "",
        "| drafts | n (calibration) | Kolmogorov-Smirnov D | p | accepted (calibration) | p |",
        "|---|---|---|---|---|---|",
    ]
    for key in ("draft", "tool_draft"):
        if key in drift:
            d = drift[key]
            lines.append(
                f"| {key} | {d['n']} ({d['n_calibration']}) | {d['ks_statistic']:.3f} | "
                f"{d['ks_pvalue']:.3g} | {d['accepted']:.3f} ({d['accepted_calibration']:.3f}) | "
                f"{d['acceptance_pvalue']:.3g} |"
            )
    if not drift["warnings"]:
        lines += [
            "",
            f"No drift at level {drift['level']:g}: the run's drafts look like the calibration ones.",
        ]
    return lines


def _markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = [f"# {report.get('title') or 'SpecEyes report'}", "", f"Run: `{report['run']}`", ""]
    lines += ["| metric | value |", "|---|---|"]
    for key in (
        "n",
        "accuracy",
        "accuracy_errors_dropped",
        "errors",
        "latency_mean_s",
        "latency_p50_s",
        "latency_p95_s",
        "wall_s",
        "throughput_qps",
        "beta",
        "alpha",
        "ideal_speedup",
        "speedup_wall",
        "speedup_latency",
        "speedup_modelled",
        "schedule",
        "tau",
    ):
        if key in s:
            lines.append(f"| {key} | {_fmt(s[key])} |")
    sc = report["scoring"]
    lines.append(
        f"| scoring | {sc['mode']}"
        + (f", judge {sc['judge']}" if sc.get("judge") else "")
        + f"; {sc.get('undecided', 0)} answers the rules could not read"
        + (f" ({sc.get('judged', 0)} sent to the judge)" if sc.get("judge") else " (counted wrong)")
        + " |"
    )
    lines.append(f"| routes | {', '.join(f'{k}: {v}' for k, v in sorted(s['routes'].items()))} |")
    if "alpha_depth" in s:
        loop, cost = s["small_loop"], s["cost_model"]
        lines.append(f"| speculation_depth | {s['speculation_depth']} |")
        lines.append(f"| alpha_depth | {_fmt(s['alpha_depth'])} |")
        lines.append(
            f"| small loop | {loop['queries']} queries, {loop['accepted']} accepted "
            f"({loop['accepted_correct']} right), {_fmt(loop['mean_steps'], '.2f')} turns each, "
            f"{loop['failed']} without an answer |"
        )
        for key, value in cost.items():
            lines.append(f"| {key} | {_fmt(value)} |")
    for warning in report.get("warnings", []):
        lines += ["", f"**Warning:** {warning}."]
    if report.get("drift"):
        lines += _drift_lines(report["drift"])
    if report.get("online_gate"):
        lines += online_lines(report["online_gate"])
    lines += ["", "## What the numbers mean", ""]
    lines += [f"- **{k}**: {v}." for k, v in report["definitions"].items()]
    lines += [
        "",
        "## Accuracy per split",
        "",
        "| split | n | accuracy | extra |",
        "|---|---|---|---|",
    ]
    for split, e in s["splits"].items():
        extra = ", ".join(f"{k} {_fmt(v)}" for k, v in e.items() if k not in ("n", "accuracy"))
        lines.append(f"| {split} | {e['n']} | {_fmt(e['accuracy'])} | {extra} |")
    if "baseline" in report:
        b = report["baseline"]["summary"]
        lines += [
            "",
            f"Baseline `{report['baseline']['run']}`: accuracy {_fmt(b['accuracy'])}, "
            f"mean latency {_fmt(b['latency_mean_s'])} s, throughput {_fmt(b['throughput_qps'])} q/s, errors {b['errors']}.",
        ]
    sw = report.get("sweep") or {}
    if sw.get("curves"):
        lines += [
            "",
            f"## Offline gate sweep ({sw['n']} queries, {sw['n_drafts']} drafts; baseline accuracy {_fmt(sw['baseline_accuracy'])})",
            "",
        ]
        lines.append(
            "AUROC for draft correctness: "
            + ", ".join(
                f"separability ({k.removeprefix('separability_')}) {_fmt(v)}"
                for k, v in sw["auroc"].items()
                if k.startswith("separability_") and (v is not None or k == "separability_min")
            )
            + f", softmax confidence {_fmt(sw['auroc']['softmax'])}; draft accuracy "
            f"{_fmt(sw['draft_accuracy'])}."
        )
        # without per-query latencies (imported runs): the share accepted beside the accuracy
        timed = any(p["speedup"] is not None for c in sw["curves"].values() for p in c)
        lines += [
            "",
            "| tau | "
            + " | ".join(f"{k} acc / {'speedup' if timed else 'accepted'}" for k in sw["curves"])
            + " |",
            "|---|" + "---|" * len(sw["curves"]),
        ]
        for i, tau in enumerate(TAUS):
            cells = [
                f"{_fmt(c[i]['accuracy'])} / {_fmt(c[i]['speedup'], '.2f')}x"
                if timed
                else f"{_fmt(c[i]['accuracy'])} / {_fmt(c[i]['accepted'])}"
                for c in sw["curves"].values()
            ]
            lines.append(f"| {tau} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(
    run_dir: str | Path,
    baseline_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    scoring: str = "strict",
    judge: Any = None,
    title: str | None = None,
    compare: Sequence[str | Path] = (),
    against: str | Path | None = None,
    drift_level: float = 0.01,
) -> dict[str, Any]:
    """Write report.md, report.json and PNG plots; returns the report (without records).

    ``compare``: other runs of the same queries (e.g. ``--mode small``, ``--mode
    specreason``) for a table of methods beside this run and the baseline."""
    report = build_report(
        run_dir,
        baseline_dir,
        scoring=scoring,
        judge=judge,
        against=against,
        drift_level=drift_level,
    )
    report["title"] = title
    if compare:
        report["methods"] = compare_methods(
            [run_dir, *compare], baseline_dir, scoring=scoring, judge=judge
        )
    out = Path(out_dir or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = plots.write_plots(report, out)
    report.pop("_records")
    (out / "report.json").write_text(json.dumps(report, indent=2))
    md = _markdown(report)
    if report.get("methods"):
        md += "\n## Methods compared\n\n" + methods_table(report["methods"])
    if report["plots"]:
        md += "\n" + "\n".join(f"![{p}]({p})" for p in report["plots"]) + "\n"
    (out / "report.md").write_text(md)
    return report
