"""A calibrated gate: choose tau so that speculation costs at most EPS accuracy, w.p. >= 1-DELTA.

The published gate uses a fixed tau (0.98). Whether that loses accuracy depends on the
models and the data. From a labelled calibration run (drafts with their top-K log-probs and
whether each draft was right; ideally also an agent-only run of the same queries) this picks
the most permissive tau whose *accuracy lost to accepted drafts* is provably small:

    loss_i(tau) = 1 if query i's draft is accepted at tau, the draft is wrong and the agent
                  would have been right (without an agent run: the draft is wrong), else 0
    risk(tau)   = E[loss(tau)]      (the drop in accuracy against agent-only, or more)

Method: Learn-then-Test (Angelopoulos et al., 2021) with fixed-sequence testing. For each
candidate tau, from the most conservative down, test H0: risk(tau) > EPS with the exact
binomial tail p-value P(Binomial(n, EPS) <= n * empirical risk); stop at the first tau that
is not rejected at level DELTA. Every tau rejected before is valid simultaneously with
probability at least 1-DELTA (fixed-sequence testing needs no multiplicity correction, and
the binomial tail is exact for 0/1 losses, so the guarantee holds for any n, without
assumptions on the scores). Several aggregations split DELTA equally (Bonferroni) and the
valid (aggregation, tau) accepting the most drafts wins. Why not a concentration bound
(Hoeffding): for rare losses the binomial tail is much tighter at the same guarantee.

The guarantee is for queries drawn like the calibration ones. ``calibrate`` can hold out a
share of the run to report what happens on queries it did not see.

Depth-D speculation has a second gate, on the small model's answer after its own tool steps
(``tool_draft``). ``calibrate`` chooses its ``tau_depth`` the same way, from the same records
with the tool drafts' scores and correctness, at the same EPS and DELTA and with the
aggregation chosen for tau (a gate has one): the two losses fall on disjoint queries (tool-free
or tool-needing), so together they cost at most 2 x EPS with probability >= 1 - 2 x DELTA.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .drift import ScoreDistribution, check_drift
from .separability import (
    DEFAULT_ALPHA,
    DEFAULT_K,
    Aggregation,
    GateConfig,
    acceptance_score,
    aggregate,
    sorted_separability,
)

__all__ = [
    "Calibration",
    "binomial_tail_pvalue",
    "calibrate",
    "draft_scores",
    "draft_token_depth",
    "gate_drift",
    "raw_draft_score",
]

AGGREGATIONS = ("min", "mean", "bottom-q")


def binomial_tail_pvalue(losses: int, n: int, eps: float) -> float:
    """P(Binomial(n, eps) <= losses): the exact p-value of H0 "risk > eps" given ``losses``."""
    from scipy.stats import binom  # where it is used: scipy.stats is slow to import

    return float(binom.cdf(losses, n, min(max(eps, 0.0), 1.0)))


def raw_draft_score(
    record: dict, aggregation: Aggregation, k: int | None = None, key: str = "draft"
) -> float | None:
    """A record's aggregated separability (before the sigmoid) recomputed from its draft's
    sorted top-K log-probs (``key="tool_draft"``: the answer of depth-D speculation).

    A score-only draft (imported from the published scripts, which keep no log-probs) has the
    separability its recorded score implies, under the aggregation it was scored with and no
    other: None for any other aggregation, never a made-up value."""
    draft = record.get(key) or {}
    top = draft.get("top_logprobs")
    if not top:
        if draft.get("score_only") and draft.get("aggregation") == aggregation:
            value = draft.get("separability")
            return float(value) if isinstance(value, (int, float)) else None
        return None
    m = np.asarray(top, dtype=float)
    if k is not None:
        m = m[:, :k]
    if m.ndim != 2 or m.shape[1] < 2 or m.shape[0] == 0 or not np.isfinite(m).all():
        return None
    return aggregate(sorted_separability(m), aggregation)


def draft_scores(
    record: dict, aggregation: Aggregation, k: int | None = None, key: str = "draft"
) -> float | None:
    """A record's acceptance score, ``sigmoid(alpha * raw_draft_score)``."""
    raw = raw_draft_score(record, aggregation, k, key)
    return None if raw is None else acceptance_score(raw, DEFAULT_ALPHA)


def draft_token_depth(records: Sequence[dict]) -> int:
    """The fewest top-K log-probs any draft kept: the K every record can be scored with."""
    depths = [
        len(r["draft"]["top_logprobs"][0])
        for r in records
        if (r.get("draft") or {}).get("top_logprobs")
    ]
    return min(depths) if depths else DEFAULT_K


@dataclass
class Calibration:
    """The chosen gate, the guarantee, and how it did on calibration and held-out queries.

    ``distribution`` summarises the calibration drafts' scores, which ``speceyes report RUN
    --against GATEFILE`` compares a later run with (:mod:`.drift`); ``mixture`` is the
    label-free fit (:mod:`.label_free`). A label-free gate has no ``max_drop``/``delta``."""

    tau: float
    aggregation: str
    k: int
    max_drop: float | None
    delta: float | None
    n_calibration: int
    method: str = "Learn-then-Test, fixed-sequence, exact binomial tail"
    loss: str = "accepted, draft wrong, agent right"
    calibration: dict[str, Any] = field(default_factory=dict)
    holdout: dict[str, Any] = field(default_factory=dict)
    tau_depth: float | None = None  # only when the records hold tool drafts (depth D > 0)
    depth_calibration: dict[str, Any] = field(default_factory=dict)
    depth_holdout: dict[str, Any] = field(default_factory=dict)
    distribution: dict[str, Any] = field(default_factory=dict)
    depth_distribution: dict[str, Any] = field(default_factory=dict)
    mixture: dict[str, Any] = field(default_factory=dict)
    depth_mixture: dict[str, Any] = field(default_factory=dict)
    # the calibration queries, labelled: [separability or None, loss], up to EVIDENCE_KEPT;
    # an online gate built from the file starts from them (OnlineGate(config=path)). The
    # raw separability, not the acceptance score: a gate with another alpha reads them right
    evidence: list[list[Any]] = field(default_factory=list)
    evidence_scale: str = "separability"

    def gate(self, base: GateConfig | None = None) -> GateConfig:
        return (base or GateConfig()).replace(
            tau=self.tau, k=self.k, aggregation=self.aggregation, tau_depth=self.tau_depth
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"gate": asdict(self)}, indent=2))


EVIDENCE_KEPT = 2000  # up to twice an online gate's default window (1,000)


def _losses_and_scores(records, agent, aggregation, k, key="draft"):
    scores, losses = [], []
    for r in records:
        s = draft_scores(r, aggregation, k, key)
        a = agent.get(r["id"], {}).get("correct", True) if agent is not None else True
        scores.append(-math.inf if s is None else s)
        losses.append(int(bool(a) and not r.get(f"{key}_correct")))
    return np.asarray(scores), np.asarray(losses)


def _unlabelled_floor(records, scores, key="draft") -> float:
    """The highest score of a draft whose correctness is unknown (``{key}_correct`` None:
    imported drafts whose text the script dropped); -inf when every draft is labelled. Only
    taus at or above it accept labelled drafts alone, so only those can be certified."""
    unknown = [
        s
        for r, s in zip(records, scores, strict=True)
        if r.get(key) and r.get(f"{key}_correct") is None and np.isfinite(s)
    ]
    return max(unknown) if unknown else -math.inf


def _certified_tau(scores, losses, grid, max_drop, level, floor=-math.inf) -> float | None:
    """Fixed-sequence testing, most conservative tau first: the last tau whose risk > EPS
    is rejected at ``level`` (None: not even the strictest); no tau below ``floor``."""
    candidates = grid or sorted(set(scores[np.isfinite(scores)].tolist()))
    candidates = [t for t in candidates if t >= floor]
    chosen = None
    for tau in sorted(candidates, reverse=True):
        accepted = scores > tau
        p = binomial_tail_pvalue(int((accepted & (losses == 1)).sum()), len(scores), max_drop)
        if p > level:
            break
        chosen = tau
    return chosen


def _evaluate(scores, losses, tau, records, agent, key="draft"):
    accepted = scores > tau
    n = len(scores)
    out = {
        "n": n,
        "accepted": float(accepted.mean()) if n else 0.0,
        "risk": float((accepted & (losses == 1)).mean()) if n else 0.0,
    }
    if agent is not None and n:
        base = np.asarray([bool(agent.get(r["id"], {}).get("correct")) for r in records])
        drafts = np.asarray([bool(r.get(f"{key}_correct")) for r in records])
        out["agent_accuracy"] = float(base.mean())
        out["accuracy_with_gate"] = float(np.where(accepted, drafts, base).mean())
    return out


def _distribution(records, aggregation, k, tau, key="draft") -> dict[str, Any]:
    raw = [raw_draft_score(r, aggregation, k, key) for r in records]
    return ScoreDistribution.from_scores([s for s in raw if s is not None], tau).to_dict()


def calibrate(
    records: Sequence[dict],
    *,
    max_drop: float,
    delta: float,
    baseline: Sequence[dict] | None = None,
    aggregations: Sequence[str] = ("min",),
    k: int | None = None,
    holdout: float = 0.0,
    taus: Sequence[float] | None = None,
) -> Calibration:
    """Choose (aggregation, tau) from labelled records (see the module docstring)."""
    if not 0 < max_drop < 1 or not 0 < delta < 1:
        raise ValueError("max_drop and delta must be in (0, 1)")
    if not 0 <= holdout < 1:
        raise ValueError("holdout must be in [0, 1)")
    unknown = set(aggregations) - set(AGGREGATIONS)
    if unknown:
        raise ValueError(f"unknown aggregations {sorted(unknown)}; use {AGGREGATIONS}")
    agent = {r["id"]: r for r in baseline} if baseline is not None else None
    rows = [r for r in records if agent is None or r["id"] in agent]

    def held(r: dict) -> bool:
        digest = int(hashlib.sha1(str(r["id"]).encode()).hexdigest()[:8], 16)
        return digest / 0xFFFFFFFF < holdout

    cal = [r for r in rows if not held(r)]
    test = [r for r in rows if held(r)]
    if not cal:
        raise ValueError("no calibration records (with drafts and, if given, a baseline)")
    depth = draft_token_depth(cal)
    k = min(k or depth, depth)
    grid = sorted(set(taus or [])) or None
    best: tuple[float, str, float] | None = None  # (acceptance, aggregation, tau)
    per_level = delta / len(aggregations)
    for aggregation in aggregations:
        scores, losses = _losses_and_scores(cal, agent, aggregation, k)
        floor = _unlabelled_floor(cal, scores)
        chosen = _certified_tau(scores, losses, grid, max_drop, per_level, floor)
        if chosen is not None:
            acceptance = float((scores > chosen).mean())
            if best is None or acceptance > best[0]:
                best = (acceptance, aggregation, chosen)
    if best is None:  # nothing can be certified: accept no draft
        aggregation, tau = aggregations[0], 1.0
    else:
        _, aggregation, tau = best
    result = Calibration(
        tau=float(tau),
        aggregation=aggregation,
        k=int(k),
        max_drop=max_drop,
        delta=delta,
        n_calibration=len(cal),
        loss="accepted, draft wrong, agent right" if agent is not None else "accepted, draft wrong",
    )
    scores, losses = _losses_and_scores(cal, agent, aggregation, k)
    result.calibration = _evaluate(scores, losses, tau, cal, agent)
    n_unlabelled = sum(1 for r in cal if r.get("draft") and r.get("draft_correct") is None)
    if n_unlabelled:
        result.calibration.update(
            unlabelled_drafts=n_unlabelled, tau_floor=float(_unlabelled_floor(cal, scores))
        )
    result.distribution = _distribution(cal, aggregation, k, tau)
    raw = [raw_draft_score(r, aggregation, k) for r in cal]  # type: ignore[arg-type]
    result.evidence = [  # a query without a draft has no loss of its own
        [float(s), bool(loss)] if s is not None and math.isfinite(s) else [None, False]
        for s, loss in zip(raw, losses, strict=True)
    ][-EVIDENCE_KEPT:]
    if test:
        scores, losses = _losses_and_scores(test, agent, aggregation, k)
        result.holdout = _evaluate(scores, losses, tau, test, agent)
    if any(r.get("tool_draft") for r in cal):  # depth-D speculation: its own threshold
        key = "tool_draft"
        scores, losses = _losses_and_scores(cal, agent, aggregation, k, key)
        floor = _unlabelled_floor(cal, scores, key)
        chosen = _certified_tau(scores, losses, grid, max_drop, delta, floor)
        result.tau_depth = 1.0 if chosen is None else float(chosen)
        result.depth_calibration = _evaluate(scores, losses, result.tau_depth, cal, agent, key)
        result.depth_distribution = _distribution(cal, aggregation, k, result.tau_depth, key)
        if test:
            scores, losses = _losses_and_scores(test, agent, aggregation, k, key)
            result.depth_holdout = _evaluate(scores, losses, result.tau_depth, test, agent, key)
    return result


def gate_drift(
    records: Sequence[dict], gate_file: str | Path, level: float = 0.01
) -> dict[str, Any]:
    """A run's drafts against the distribution its gate was calibrated on (:mod:`.drift`):
    ``{"draft": DriftCheck dict, "tool_draft": ..., "warnings": [...]}``."""
    data = json.loads(Path(gate_file).read_text())
    gate = data.get("gate", data)
    out: dict[str, Any] = {"gate_file": str(gate_file), "level": level, "warnings": []}
    stages = (
        ("draft", "distribution", gate.get("tau")),
        ("tool_draft", "depth_distribution", gate.get("tau_depth")),
    )
    for key, field_name, tau in stages:
        if not gate.get(field_name) or tau is None:
            continue
        raw = [
            raw_draft_score(r, gate.get("aggregation", "min"), gate.get("k"), key) for r in records
        ]
        raw = [s for s in raw if s is not None]
        if not raw:
            out["warnings"].append(
                f"the run has no {key}s with log-probs to compare with the gate's"
            )
            continue
        what = "drafts" if key == "draft" else "tool drafts"
        check = check_drift(
            raw,
            ScoreDistribution.from_dict(gate[field_name]),
            tau,
            alpha=gate.get("alpha", DEFAULT_ALPHA),
            level=level,
            what=what,
        )
        out[key] = check.as_dict()
        out["warnings"] += list(check.warnings)
    if not gate.get("distribution"):
        out["warnings"].append(
            f"{gate_file} records no calibration distribution (written by an older version?): "
            "calibrate again to watch for drift"
        )
    return out
