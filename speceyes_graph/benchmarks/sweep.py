"""Gates re-run offline: what any tau would have done to a labelled run, from its records.

A query's outcome is its draft's correctness if the draft would be accepted, else the
agent's correctness from the baseline run; its modelled latency is its judge and draft time
plus, if rejected, the agent's latency from the baseline run (the paper's per-query cost
model, not a wall-clock measurement). ``sweep`` walks a grid of taus for the report's
curves; ``compare_gates`` puts named thresholds side by side (the published 0.98, a
labelled calibration, a label-free one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from ..gate.separability import Aggregation
from .draft_scores import auroc, draft_score, draft_token_scores

__all__ = ["AGGREGATIONS", "TAUS", "compare_gates", "gate_outcome", "gates_table", "sweep"]

TAUS = [
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.92,
    0.94,
    0.95,
    0.96,
    0.97,
    0.98,
    0.985,
    0.99,
    0.995,
    0.999,
]
AGGREGATIONS: tuple[Aggregation, ...] = ("min", "mean", "bottom-q")
TOOL_FREE_ROUTES = ("speculative", "rejected-agentic", "draft-only")


def gate_outcome(
    rows: Sequence[dict],
    agent: Mapping[str, dict],
    tau: float,
    aggregation: str = "min",
    score: str = "separability",
) -> dict[str, Any]:
    """Accuracy, modelled speedup and acceptance of ``rows`` gated at ``tau``.

    Accuracy is None when a draft of unknown correctness would be accepted (imported runs
    whose script dropped rejected drafts' text); speedup is None when latencies were not
    recorded (the published scripts time whole files, not queries)."""
    correct = latency = accepted = accepted_right = drafts = 0.0
    unknown = False
    timed = all(isinstance(agent[r["id"]].get("latency_s"), (int, float)) for r in rows)
    base_latency = sum(agent[r["id"]]["latency_s"] for r in rows) if timed else 0.0
    for r in rows:
        a = agent[r["id"]]
        t = r.get("timings") or {}
        cost = t.get("judge", 0.0)
        draft = r.get("draft")
        tool_free = r.get("route") in TOOL_FREE_ROUTES
        # a separability aggregation is one of AGGREGATIONS (aggregate() raises otherwise);
        # the softmax score ignores it (the sweep names that curve "geo-mean")
        agg = cast(Aggregation, aggregation) if score == "separability" else "min"
        s = draft_score(draft, agg, score) if tool_free and draft else None
        cost += t.get("speculate", 0.0) if tool_free else 0.0
        drafts += s is not None
        if s is not None and s > tau:
            accepted += 1
            unknown |= r.get("draft_correct") is None
            accepted_right += bool(r.get("draft_correct"))
            correct += bool(r.get("draft_correct"))
        else:
            correct += a["correct"]
            cost += a["latency_s"] if timed else 0.0
        latency += cost
    n = len(rows)
    return {
        "tau": tau,
        "accuracy": correct / n if n and not unknown else None,
        "speedup": base_latency / latency if timed and latency else None,
        "accepted": accepted / n if n else None,
        "accepted_of_drafts": accepted / drafts if drafts else None,
        "accepted_accuracy": accepted_right / accepted if accepted and not unknown else None,
    }


def _paired(records: list[dict], baseline: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    agent = {r["id"]: r for r in baseline}
    return [r for r in records if r["id"] in agent], agent


def sweep(
    records: list[dict], baseline: list[dict], taus: Sequence[float] = TAUS
) -> dict[str, Any]:
    """Offline gate sweep: accuracy and modelled speedup for every tau and aggregation."""
    rows, agent = _paired(records, baseline)
    if not rows:
        return {}
    base_acc = sum(agent[r["id"]]["correct"] for r in rows) / len(rows)
    out: dict[str, Any] = {"n": len(rows), "baseline_accuracy": base_acc, "curves": {}}
    for score in ("separability", "softmax"):
        for aggregation in AGGREGATIONS if score == "separability" else ("geo-mean",):
            agg = cast(Aggregation, aggregation) if score == "separability" else "min"
            if not any(r.get("draft") and draft_score(r["draft"], agg, score) for r in rows):
                continue  # no draft has this score (imported drafts keep only their own)
            out["curves"][f"{score}:{aggregation}"] = [
                {
                    k: v
                    for k, v in gate_outcome(rows, agent, tau, aggregation, score).items()
                    if k in ("tau", "accuracy", "speedup", "accepted")
                }
                for tau in taus
            ]
    drafts = [r for r in rows if r.get("draft") and r.get("draft_correct") is not None]  # labelled
    # min always; an imported run without min scores: its own aggregation beside it
    shown: list[Aggregation] = ["min"]
    if "separability:min" not in out["curves"]:
        shown += [a for a in AGGREGATIONS if f"separability:{a}" in out["curves"]]
    out["auroc"] = {f"separability_{a}": _auroc_of(drafts, a, "separability") for a in shown}
    out["auroc"]["softmax"] = _auroc_of(drafts, "min", "softmax")
    labels = [bool(r["draft_correct"]) for r in drafts if _scored(r["draft"])]
    out["n_drafts"] = sum(1 for r in rows if r.get("draft") and _scored(r["draft"]))
    out["n_labelled_drafts"] = len(labels)
    out["draft_accuracy"] = sum(labels) / len(labels) if labels else None
    return out


def _scored(draft: dict) -> bool:
    """A draft the gate could score: token log-probs, or an imported score."""
    return draft_token_scores(draft) is not None or bool(draft.get("score_only"))


def _auroc_of(drafts: Sequence[dict], aggregation: Aggregation, score: str) -> float | None:
    """AUROC of one score over the labelled drafts that have it."""
    pairs = [
        (draft_score(r["draft"], aggregation, score), bool(r["draft_correct"])) for r in drafts
    ]
    kept = [(s, y) for s, y in pairs if s is not None]
    return auroc([s for s, _ in kept], [y for _, y in kept]) if kept else None


def compare_gates(
    records: list[dict],
    baseline: list[dict],
    taus: Mapping[str, float | None],
    aggregation: str = "min",
) -> list[dict[str, Any]]:
    """One row per named tau (None: that calibration refused or failed), against labels."""
    rows, agent = _paired(records, baseline)
    if not rows:
        raise ValueError("no query of the run is in the baseline")
    agent_accuracy = sum(agent[r["id"]]["correct"] for r in rows) / len(rows)
    out = []
    for name, tau in taus.items():
        row: dict[str, Any] = {"gate": name, "tau": tau, "agent_accuracy": agent_accuracy}
        if tau is not None:
            row.update(gate_outcome(rows, agent, tau, aggregation))
        out.append(row)
    return out


def _cell(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def gates_table(rows: Sequence[dict[str, Any]]) -> str:
    """``compare_gates`` as a Markdown table."""
    lines = [
        "| gate | tau | accepted (of queries / of drafts) | accuracy of accepted drafts "
        "| accuracy (agent only) | modelled speedup |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["tau"] is None:
            lines.append(f"| {r['gate']} | refused | - | - | - ({r['agent_accuracy']:.3f}) | - |")
            continue
        lines.append(
            f"| {r['gate']} | {r['tau']:.6g} | {_cell(r['accepted'], '.3f')} / "
            f"{_cell(r['accepted_of_drafts'], '.3f')} | {_cell(r['accepted_accuracy'], '.3f')} | "
            f"{_cell(r['accuracy'], '.3f')} ({r['agent_accuracy']:.3f}) | "
            f"{_cell(r['speedup'], '.2f')}x |"
        )
    return "\n".join(lines) + "\n"
