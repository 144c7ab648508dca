"""What ``speceyes demo`` prints and writes: one figure per definition, and the README.

The numbers come from the reports (:mod:`..benchmarks.report`); this module only chooses
which to show and says what each means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..benchmarks.report import DEFINITIONS, build_report
from ..gate.separability import separability_of

__all__ = [
    "LABELS",
    "ROUTE_WORDS",
    "MICRO_SPLIT",
    "SPLITS",
    "demo_summary",
    "depth_summary",
    "label",
    "mode_row",
    "online_summary",
    "readme",
    "summary_text",
]

SPLITS = {True: "needs-zoom", False: "no-zoom"}
MICRO_SPLIT = "micro"  # needs zoom, and a detail only the large model is trained to read
LABELS = {
    "agent": "agent only",
    "online": "SpecEyes online",
    "speceyes": "SpecEyes",
    "small": "small model only",
    "specreason": "SpecReason",
}
ROUTE_WORDS = {
    "speculative": "judge: no tools needed; draft accepted by the gate",
    "judged-agentic": "judge: tools needed; agent loop",
    "rejected-agentic": "judge: no tools needed; draft rejected by the gate; agent loop",
    "speculative-tools": "judge: tools needed; the small model zoomed, its answer kept by the gate",
}


def label(mode: str, depth: int = 0) -> str:
    """A configuration's name in the table; with a depth-D run beside it, SpecEyes says
    which depth it is."""
    if mode == "depth":
        return f"SpecEyes depth {depth}"
    return "SpecEyes depth 0" if mode == "speceyes" and depth else LABELS[mode]


def depth_summary(
    out: Path, records: dict[str, list[dict]], depth: int, summary: dict[str, Any]
) -> dict[str, Any]:
    """The depth-D run beside depth 0 and agent only: its table row, its speedups over both
    (measured in this run, wall time per query), alpha_D and the extended cost model."""
    report = build_report(out / "run-depth", out / "run-agent")["summary"]
    walls = {m: summary["rows"][m]["wall_s"] for m in ("agent", "speceyes")}
    rows = {**summary["rows"], "depth": mode_row(report, records["depth"])}
    # the table in run order: agent, depth 0, depth D, then the rest
    order = [
        "agent",
        "speceyes",
        "depth",
        *(m for m in rows if m not in ("agent", "speceyes", "depth")),
    ]
    wall = report["wall_s"]
    return {
        "rows": {m: rows[m] for m in order},
        "depth": {
            "depth": depth,
            "speedup_over_agent": walls["agent"] / wall if wall and walls["agent"] else None,
            "speedup_over_depth0": walls["speceyes"] / wall if wall and walls["speceyes"] else None,
            "alpha_depth": report.get("alpha_depth"),
            "routes": report["routes"],
            "small_loop": report.get("small_loop"),
            "cost_model": report.get("cost_model"),
        },
    }


def _split_accuracy(records: list[dict], split: str) -> float | None:
    rs = [r for r in records if r["split"] == split]
    return sum(r["correct"] for r in rs) / len(rs) if rs else None


def mode_row(summ: dict, records: list[dict]) -> dict[str, Any]:
    """One configuration's line of the table, from its report summary and records."""
    return {
        "accuracy": summ["accuracy"],
        "needs_zoom": _split_accuracy(records, SPLITS[True]),
        "micro": _split_accuracy(records, MICRO_SPLIT),
        "no_zoom": _split_accuracy(records, SPLITS[False]),
        "wall_s": summ["wall_s"],
        "latency_mean_s": summ["latency_mean_s"],
        "errors": summ["errors"],
    }


def demo_summary(report: dict, gate: dict, records: dict[str, list[dict]]) -> dict[str, Any]:
    s, b = report["summary"], report["baseline"]["summary"]
    small = gate["summary"]
    tau = s["tau"]
    rows = {
        mode: mode_row(summ, records[mode])
        for mode, summ in (("agent", b), ("speceyes", s), ("small", small))
    }
    ideal, wall = s.get("ideal_speedup"), s.get("speedup_wall")
    return {
        "n": s["n"],
        "n_needs_zoom": sum(r["split"] != SPLITS[False] for r in records["speceyes"]),
        "n_micro": sum(r["split"] == MICRO_SPLIT for r in records["speceyes"]),
        "rows": rows,
        "speedup_wall": wall,
        "speedup_latency": s.get("speedup_latency"),
        "ideal_speedup": ideal,
        "share_of_ideal": wall / ideal if wall and ideal else None,
        "speedup_modelled": s.get("speedup_modelled"),
        "beta": s["beta"],
        "alpha": s["alpha"],
        "tau": tau,
        "tau_separability": separability_of(tau),
        "routes": s["routes"],
        "auroc_separability": gate["sweep"]["auroc"]["separability_min"],
        "auroc_softmax": gate["sweep"]["auroc"]["softmax"],
        "errors": sum(row["errors"] for row in rows.values()),
        "definitions": {k: DEFINITIONS[k] for k in DEMO_DEFINED},
    }


DEMO_DEFINED = (
    "beta",
    "alpha",
    "tau",
    "separability",
    "speedup_wall",
    "speedup_latency",
    "ideal_speedup",
    "speedup_modelled",
    "auroc",
    "alpha_depth",
    "expected_latency_s",
)


def _f(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def summary_text(summary: dict[str, Any]) -> str:
    """The printed table: every figure with its definition, one line each."""
    rows, n = summary["rows"], summary["n"]
    lines = [
        f"{n} held-out demo queries ({summary['n_needs_zoom']} need zooming: tiny objects, "
        f"{summary.get('n_micro', 0)} of them micro), embedded demo checkpoints, this machine",
        f"engine: {(summary.get('engine') or {}).get('description', 'transformers')}",
        "",
        f"{'':<18}{'accuracy':>9}{'needs zoom':>12}{'micro':>7}{'no zoom':>9}{'wall s':>9}"
        f"{'mean latency s':>16}",
    ]
    depth = (summary.get("depth") or {}).get("depth", 0)
    for mode, row in rows.items():
        lines.append(
            f"{label(mode, depth):<18}{_f(row['accuracy']):>9}{_f(row['needs_zoom']):>12}"
            f"{_f(row.get('micro')):>7}{_f(row['no_zoom']):>9}{_f(row['wall_s'], '.1f'):>9}{_f(row['latency_mean_s'], '.2f'):>16}"
        )
    d = summary["definitions"]
    share = summary["share_of_ideal"]
    figures = [
        ("speedup_wall", f"{_f(summary['speedup_wall'], '.2f')}x", d["speedup_wall"]),
        (
            "ideal_speedup",
            f"{_f(summary['ideal_speedup'], '.2f')}x",
            d["ideal_speedup"] + (f" (measured/ideal = {share:.2f})" if share else ""),
        ),
        ("speedup_latency", f"{_f(summary['speedup_latency'], '.2f')}x", d["speedup_latency"]),
        ("speedup_modelled", f"{_f(summary['speedup_modelled'], '.2f')}x", d["speedup_modelled"]),
        ("beta", _f(summary["beta"]), d["beta"]),
        ("alpha", _f(summary["alpha"]), d["alpha"]),
        (
            "tau",
            f"{summary['tau']:g}",
            d["tau"] + f" (= separability {summary['tau_separability']:.2f})",
        ),
        ("separability", "", d["separability"]),
        (
            "auroc",
            _f(summary["auroc_separability"]),
            d["auroc"] + f" (softmax confidence: {_f(summary['auroc_softmax'])})",
        ),
    ]
    lines.append("")
    for name, value, meaning in figures:
        lines.append(f"{name:<17}{value:>7}  {meaning}")
    if summary.get("specreason"):
        sr = summary["specreason"]
        lines.append(
            f"\nSpecReason: {_f(sr['speedup_wall'], '.2f')}x the agent's throughput; the large "
            f"model kept {sr['accepted']} of {sr['steps']} drafted steps (the demo agent was never "
            "trained to score steps 0-9: most of its replies hold no digit, which counts as 0)"
        )
    lines.append(
        "\nroutes (SpecEyes): "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["routes"].items()))
    )
    if depth:
        lines += _depth_lines(summary["depth"], summary["definitions"])
    if summary.get("online"):
        lines += _online_lines(summary["online"])
    for ex in summary.get("examples", []):
        lines.append(
            f"example {ex['route']:<17} {ex['id']}: {ex['question']!r} -> {ex['answer']!r} "
            f"(expected {ex['expected']!r}) {ex['file']}"
        )
    return "\n".join(lines)


def online_summary(
    report: dict,
    records: list[dict],
    gate_state: dict[str, Any],
    summary: dict[str, Any],
    shadow_tail_s: float = 0.0,
) -> dict[str, Any]:
    """The online-gate run beside the others: its table row (after SpecEyes), what its gate
    did against agent only's answers, its share of the published tau's wall-time speedup,
    and what its shadow runs cost (``shadow_tail_s``: how long the last of them ran on
    after the run's last answer: work off the users' path, but work)."""
    rows = dict(summary["rows"])
    order = [*(m for m in rows if m != "small"), "online", "small"]
    rows["online"] = mode_row(report["summary"], records)
    path = report.get("online_gate") or {}
    wall, static = report["summary"].get("speedup_wall"), summary.get("speedup_wall")
    return {
        "rows": {m: rows[m] for m in order if m in rows},
        "online": {
            **{k: v for k, v in path.items() if k != "path"},
            "speedup_wall": wall,
            "share_of_static_speedup": wall / static if wall and static else None,
            "shadow_tail_s": shadow_tail_s,
            "static_acceptance": summary["alpha"] * summary["beta"]
            if summary.get("alpha") is not None and summary.get("beta") is not None
            else None,
            "shadow_runs": gate_state["shadow_runs"],
        },
    }


def _online_lines(o: dict[str, Any]) -> list[str]:
    runs = o["shadow_runs"]
    return [
        "",
        f"online gate: target risk {_f(o.get('max_risk'), 'g')}; realised {_f(o['realised_risk'], '.4f')} "
        "(queries answered by an accepted draft that disagrees with agent only's answer)",
        f"{'':<17}tau {_f(o['tau_start'], '.4f')} -> {_f(o['tau_end'], '.4f')} (min "
        f"{_f(o['tau_min'], '.4f')}, max {_f(o['tau_max'], '.4f')}); accepted {o['accepted']} "
        f"of {o['queries']} ({_f(o['acceptance'])}; the published tau: "
        f"{_f(o['static_acceptance'])}); {_f(o['speedup_wall'], '.2f')}x agent only's throughput",
        f"{'':<17}({_f(o.get('share_of_static_speedup'), '.2f')} of the published tau's wall-time "
        "speedup)",
        f"{'':<17}{runs['started']} shadow runs ({runs['labelled']} labelled, {runs['failed']} "
        f"failed, {runs['dropped']} dropped), {runs['seconds']:.1f} s of agent time off the "
        f"users' path, the last done {o.get('shadow_tail_s', 0.0):.1f} s after the run's last "
        f"answer; the gate's last estimate {_f(o.get('gate_risk_end'), '.4f')} (at most "
        f"{_f(o.get('gate_risk_bound_end'), '.4f')})",
    ]


def _depth_lines(dd: dict[str, Any], d: dict[str, str]) -> list[str]:
    """Depth-D speculation against depth 0 and agent only, each figure defined."""
    loop, cost = dd.get("small_loop") or {}, dd.get("cost_model") or {}
    return [
        "",
        f"depth {dd['depth']}: {_f(dd['speedup_over_depth0'], '.2f')}x depth 0's throughput and "
        f"{_f(dd['speedup_over_agent'], '.2f')}x agent only's (wall time per query, this run)",
        f"{'alpha_depth':<17}{_f(dd['alpha_depth']):>7}  {d['alpha_depth']}",
        f"{'small loop':<17}{loop.get('queries', 0):>7}  queries; {loop.get('accepted', 0)} "
        f"accepted ({loop.get('accepted_correct', 0)} right), {_f(loop.get('mean_steps'), '.2f')} "
        f"turns each, {loop.get('failed', 0)} without an answer",
        f"{'E[L]':<17}{_f(cost.get('expected_latency_s'), '.3f'):>7}  s per query: "
        f"{d['expected_latency_s']} (c_J {_f(cost.get('c_judge_s'))}, c_S "
        f"{_f(cost.get('c_draft_s'))}, c_S^D {_f(cost.get('c_small_loop_s'))}, L_agent "
        f"{_f(cost.get('l_agent_s'))} s)",
        "routes (depth "
        + str(dd["depth"])
        + "): "
        + ", ".join(f"{k} {v}" for k, v in sorted(dd["routes"].items())),
    ]


def readme(summary: dict[str, Any], text: str) -> str:
    return (
        f"""# speceyes demo output

SpecEyes (judge -> speculate -> gate -> agent loop) against the agent-only baseline on
{summary["n"]} held-out queries of the demo world: one coloured object in a 1024 px scene, in
the region the question names. Large objects can be seen at the models' 112-128 px input;
tiny ones ({summary["n_needs_zoom"]} queries) only after zooming; {summary.get("n_micro", 0)} of those have a
micro target (5-8 px), a few pixels even after the zoom, which only the large model was
trained to read: the queries depth-D speculation must hand back to the agent. The large model (Qwen2.5-VL,
2.75M parameters) judges and, as the agent, thinks, zooms on the region and answers; the small
one (Qwen3-VL, 1.4M parameters) drafts answers. Both were trained on a CPU with
`speceyes train-demo`. Timings are this machine's, with cross-query batching.
The models ran on: {(summary.get("engine") or {}).get("description", "transformers")}.

```
{text}
```

## Files

| file | what it shows |
|---|---|
| `workflow.png` | the graph: the judge's yes/no, the gate's accept/reject, the agent loop |
| `examples/*.png` | one query per route: the question, the zoom box the agent chose, the crop, each configuration's answer |
| `run-speceyes/report.md` | SpecEyes against the agent-only run: accuracy per split, speedups, the offline tau sweep |
| `gate/report.md` | the small model's draft on every query: separability histogram with tau, ROC against softmax confidence |
| `run-*/records.jsonl` | one JSON line per query: route, judge output, draft with its top-K log-probs, agent steps, timings |
| `scenes/` | the query images |

## Definitions

"""
        + "\n".join(f"- **{k}**: {v}." for k, v in summary["definitions"].items())
        + "\n"
    )
