"""Replaying a stream of queries through the online gate: run folders or simulated traffic.

A stream is a list of :class:`StreamQuery` (a draft's acceptance score, or None when the
judge sent the query to the agent, and whether the draft disagrees with the agent's answer).
:func:`replay` gates it query by query with an :class:`~speceyes_graph.gate.online.OnlineGate`
as production would: a rejected draft's label arrives (the agent ran), an accepted draft's
only when the gate shadowed it. What the replay reports is realised on *every* query,
labelled or not, since a replay knows all the labels: the risk (queries answered by a
disagreeing accepted draft), acceptance, agent calls (fallbacks and shadows), and the path
of tau; :func:`hindsight_tau` is what the best fixed tau of each segment would have done.

:func:`simulated_stream` makes traffic with known drift (abrupt or gradual changes of the
drafts' error rate and score shapes, V* to HR-Bench-like); :func:`stream_from_records`
reads run folders (this package's runs and ``speceyes import-official`` ones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..gate.online import OnlineGate

__all__ = [
    "SCENARIOS",
    "Segment",
    "StreamQuery",
    "hindsight_tau",
    "replay",
    "simulated_evidence",
    "simulated_stream",
    "stream_from_records",
    "summarise",
]


@dataclass(frozen=True)
class StreamQuery:
    score: float | None  # the draft's acceptance score; None: no draft (judged agentic)
    disagrees: bool  # the draft disagrees with the agent (False without a draft)
    segment: str  # the run or workload it came from
    source: str = "simulated"  # where its label came from: "agent", "reference", "simulated"


@dataclass(frozen=True)
class Segment:
    """Simulated traffic of one workload: ``n`` queries, a share ``drafted`` judged
    tool-free, drafts wrong with chance ``error``, and separability ~ Normal(``right``) for
    right drafts and Normal(``wrong``) for wrong ones (mean, sd), scored ``sigmoid(0.6 S)``."""

    name: str
    n: int
    error: float
    right: tuple[float, float] = (8.0, 2.5)
    wrong: tuple[float, float] = (4.0, 2.5)
    drafted: float = 0.7


# Drafts' error rates and score shapes like the published runs' (V* drafts wrong more often
# and less separable than HR-Bench's); 3,000 queries each.
VSTAR = Segment("vstar-like", 3000, 0.25, right=(7.0, 2.5), wrong=(4.5, 2.5))
HR4K = Segment("hr4k-like", 3000, 0.12)
HR8K = Segment("hr8k-like", 3000, 0.18, right=(7.5, 2.5), wrong=(4.0, 2.5))
SCENARIOS: dict[str, tuple[list[Segment], int]] = {
    "none": ([Segment("hr4k-like", 9000, 0.12)], 0),
    "abrupt": ([VSTAR, HR4K, HR8K], 0),
    "gradual": ([VSTAR, HR4K, HR8K], 1000),
}
"""Simulated traffic: (segments, queries over which each change blends in)."""


def simulated_stream(segments: Sequence[Segment], seed: int, gradual: int = 0) -> list[StreamQuery]:
    """Queries of each segment in turn; ``gradual`` > 0 blends each change over that many
    queries (each query drawn from the next segment with a chance rising linearly)."""
    rng = np.random.default_rng(seed)
    out: list[StreamQuery] = []
    for i, seg in enumerate(segments):
        prev = segments[i - 1] if i else seg
        for j in range(seg.n):
            mix = min(1.0, (j + 1) / gradual) if gradual and i else 1.0
            src = seg if rng.random() < mix else prev
            if rng.random() >= src.drafted:
                out.append(StreamQuery(None, False, seg.name))
                continue
            wrong = bool(rng.random() < src.error)
            mean, sd = src.wrong if wrong else src.right
            score = 1 / (1 + math.exp(-0.6 * rng.normal(mean, sd)))
            out.append(StreamQuery(score, wrong, seg.name))
    return out


def simulated_evidence(segment: Segment, n: int, seed: int) -> list[tuple[float | None, bool]]:
    """``n`` labelled queries of ``segment``'s kind as a gate file keeps them (separability
    or None, disagrees): a calibration run before the deployment."""
    rng = np.random.default_rng(seed)
    out: list[tuple[float | None, bool]] = []
    for _ in range(n):
        if rng.random() >= segment.drafted:
            out.append((None, False))
            continue
        wrong = bool(rng.random() < segment.error)
        mean, sd = segment.wrong if wrong else segment.right
        out.append((float(rng.normal(mean, sd)), wrong))
    return out


@dataclass
class ReplayLog:
    """Per query of a replay: tau met, accepted, shadowed, disagreeing accepted (a loss)."""

    segment: list[str] = field(default_factory=list)
    tau: list[float] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    shadowed: list[bool] = field(default_factory=list)
    loss: list[bool] = field(default_factory=list)
    drafted: list[bool] = field(default_factory=list)


def replay(
    stream: Sequence[StreamQuery], gate: OnlineGate, lost_shadows: float = 0.0, seed: int = 0
) -> ReplayLog:
    """Gate each query in order; ``lost_shadows``: the chance a shadow run fails (its label
    is lost, nothing else)."""
    rng = np.random.default_rng(seed)
    log = ReplayLog()
    for q in stream:
        if q.score is None:
            gate.observe(None, None, None)
            log.segment.append(q.segment)
            log.tau.append(gate.tau)
            log.accepted.append(False)
            log.shadowed.append(False)
            log.loss.append(False)
            log.drafted.append(False)
            continue
        decision = gate.decide(q.score)
        lost = decision.shadowed and rng.random() < lost_shadows
        labelled = not decision.accepted or (decision.shadowed and not lost)
        # a lost shadow's draft is an accepted draft without a label, as in the graph
        observed = replace(decision, shadowed=False) if lost else decision
        gate.observe(observed, q.score, q.disagrees if labelled else None)
        log.segment.append(q.segment)
        log.tau.append(decision.tau)
        log.accepted.append(decision.accepted)
        log.shadowed.append(decision.shadowed)
        log.loss.append(decision.accepted and q.disagrees)
        log.drafted.append(True)
    return log


def hindsight_tau(
    stream: Sequence[StreamQuery], max_risk: float, taus: Sequence[float]
) -> tuple[float, float]:
    """(tau, acceptance) of the most permissive fixed tau whose realised risk on ``stream``
    is at most ``max_risk``: what an oracle that saw the segment's labels would have chosen."""
    n = len(stream)
    best = (1.0, 0.0)
    for t in sorted(taus, reverse=True):
        accepted = [q for q in stream if q.score is not None and q.score > t]
        if sum(q.disagrees for q in accepted) > max_risk * n:
            break
        best = (t, len(accepted) / n)
    return best


def summarise(
    stream: Sequence[StreamQuery],
    log: ReplayLog,
    max_risk: float,
    taus: Sequence[float],
    window: int | None = None,
) -> dict[str, Any]:
    """Per segment and overall: acceptance, realised risk, accepted drafts' error, agent
    calls (fallbacks and shadows), taus met, and the hindsight tau's acceptance; with
    ``window``, the worst realised risk over consecutive windows of that many queries."""

    def part(idx: list[int], name: str) -> dict[str, Any]:
        n = len(idx)
        acc = sum(log.accepted[i] for i in idx)
        losses = sum(log.loss[i] for i in idx)
        taus_met = [log.tau[i] for i in idx if log.drafted[i]]
        best_tau, best_acc = hindsight_tau([stream[i] for i in idx], max_risk, taus)
        labels: dict[str, dict[str, Any]] = {}
        for i in idx:
            q = stream[i]
            if q.score is None:
                continue
            entry = labels.setdefault(q.source, {"drafts": 0, "losses": 0, "scores": []})
            entry["drafts"] += 1
            entry["losses"] += int(log.loss[i])
            entry["scores"].append(q.score)
        for entry in labels.values():
            scores = entry.pop("scores")
            entry["score_min"], entry["score_max"] = min(scores), max(scores)
        return {
            "segment": name,
            "queries": n,
            "acceptance": acc / n if n else 0.0,
            "risk": losses / n if n else 0.0,
            "accepted_error": losses / acc if acc else 0.0,
            "fallbacks": sum(not log.accepted[i] for i in idx),
            "shadows": sum(log.shadowed[i] for i in idx),
            "agent_calls": (
                sum(not log.accepted[i] or log.shadowed[i] for i in idx) / n if n else 0.0
            ),
            "tau_start": taus_met[0] if taus_met else None,
            "tau_min": min(taus_met) if taus_met else None,
            "tau_max": max(taus_met) if taus_met else None,
            "tau_end": taus_met[-1] if taus_met else None,
            "hindsight_tau": best_tau,
            "hindsight_acceptance": best_acc,
            "acceptance_ratio": (acc / n) / best_acc if n and best_acc else None,
            "labels": labels,
        }

    names = list(dict.fromkeys(log.segment))
    out: dict[str, Any] = {
        "segments": [
            part([i for i, s in enumerate(log.segment) if s == name], name) for name in names
        ],
        "overall": part(list(range(len(log.segment))), "overall"),
    }
    if window:
        risks = [
            sum(log.loss[i : i + window]) / window
            for i in range(0, len(log.loss) - window + 1, window)
        ]
        out["window"] = window
        out["worst_window_risk"] = max(risks) if risks else None
        out["window_risks"] = risks
    return out


def stream_from_records(
    runs: Sequence[tuple[str, Sequence[dict]]], aggregation: str = "min", k: int | None = None
) -> tuple[list[StreamQuery], dict[str, int]]:
    """A stream from run folders' records, in the given order; returns it and how many
    labels came from the agent's answer (``agent``) or the reference answer (``reference``).

    A record's draft disagrees with the agent when the record holds the agent's answer
    (route ``rejected-agentic``: the agent answered after the gate), else when the draft is
    wrong against the reference answer (its ``draft_correct``). Records without a gated
    draft are queries the judge sent to the agent. Imported drafts whose correctness the
    script did not keep count as disagreeing (the cautious reading)."""
    from ..answers import answers_agree
    from ..gate.calibration import draft_scores

    stream: list[StreamQuery] = []
    sources = {"agent": 0, "reference": 0}
    for name, records in runs:
        for r in records:
            draft = r.get("draft")
            score = draft_scores(r, aggregation, k) if draft else None  # type: ignore[arg-type]
            if score is None:
                stream.append(StreamQuery(None, False, name))
                continue
            if r.get("route") == "rejected-agentic" and r.get("answer") is not None and draft:
                disagrees = not answers_agree(draft.get("text"), r["answer"], r.get("options"))
                source = "agent"
            else:
                disagrees = r.get("draft_correct") is not True
                source = "reference"
            sources[source] += 1
            stream.append(StreamQuery(score, disagrees, name, source))
    return stream, sources
