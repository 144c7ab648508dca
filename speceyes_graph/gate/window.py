"""The online gate's window arithmetic: which observations count, the risk each candidate
tau would have had on them with its exact bound, and the tau they certify.

Pure functions of the observations (:class:`~speceyes_graph.gate.ledger.Observation`), so
that :class:`~speceyes_graph.gate.online.OnlineGate` keeps only state, locking and
sharing, and what the guarantee rests on reads in one place (docs/calibration.md, "An
online gate")."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .bounds import count_upper_bound
from .ledger import Observation

__all__ = ["certified_tau", "pending", "settled", "window_risk"]


def settled(
    queries: list[Observation],
    now: float,
    patience_s: float,
    alive: Callable[[str], bool] = lambda worker: True,
) -> list[Observation]:
    """The window up to the oldest shadow run still under way: a time prefix of the traffic
    in which every shadow coin that came up has its label (a shadow that fails or finds no
    room joins as an unshadowed accepted draft). Counting the drafts after it would make
    the gate pay for the shadows' latency: accepted drafts join at once, their shadowed
    cohort's labels seconds later, so the group's bound rises with every unlabelled draft
    until the labels land, and tau swings (on the demo's CPU, where a shadow waits seconds,
    it held a third of the drafts out). Cutting by time is unbiased while how long a shadow
    takes is independent of its outcome. A shadow in flight for more than ``patience_s``,
    or held by a worker that no longer shows signs of life (``alive(q.by)`` False: a worker
    killed mid-run leaves its shadows in flight for good), is left out and holds nothing
    back."""
    waiting = [
        q.at
        for q in queries
        if q.shadowed and q.disagrees is None and now - q.at < patience_s and alive(q.by)
    ]
    mark = min(waiting, default=math.inf)
    return [q for q in queries if q.at < mark and not pending(q)]


def pending(q: Observation) -> bool:
    """A label still to come: a shadowed draft's, or a rejected draft's (its agent runs).
    A rejected one is left out until its label lands but holds nothing back: a run a
    client stopped before its agent (``interrupt_before``) would otherwise hold every
    worker's window for as long as it waits."""
    return q.disagrees is None and (q.shadowed or (not q.accepted and q.score is not None))


def window_risk(
    queries: Sequence[Observation], taus: np.ndarray, delta: float, levels: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(estimated risk, its exact upper bound) of the window at each candidate in ``taus``:
    rejected drafts' disagreements counted, and for the accepted ones, group by group of
    the chance they were shadowed with, the share of those shadowed that disagreed (a
    uniform sample of the group: unbiased) and the exact bound on the group's
    disagreements given that sample (hypergeometric: it was drawn without replacement)
    at level ``delta`` split over the groups (at least ``levels``, the chances the policy
    may give)."""
    n = max(len(queries), 1)

    def above(scores: list[float]) -> np.ndarray:  # how many exceed each candidate
        ordered = np.sort(np.asarray(scores, dtype=float))
        return len(ordered) - np.searchsorted(ordered, taus, side="right")

    drafted = [q for q in queries if q.score is not None]
    lost = above([q.score for q in drafted if not q.accepted and q.disagrees]).astype(float)  # type: ignore[misc]
    estimate, bound = lost.copy(), lost.copy()
    groups = sorted({q.chance for q in drafted if q.accepted})
    split = delta / max(levels, len(groups), 1)
    for chance in groups:
        group = [q for q in drafted if q.accepted and q.chance == chance]
        accepted = above([q.score for q in group])  # type: ignore[misc]
        labelled = [q for q in group if q.disagrees is not None]
        shadowed = above([q.score for q in labelled])  # type: ignore[misc]
        wrong = above([q.score for q in labelled if q.disagrees])  # type: ignore[misc]
        share = np.divide(wrong, shadowed, out=np.zeros(len(taus)), where=shadowed > 0)
        estimate += accepted * share
        bound += count_upper_bound(wrong, shadowed, accepted, split)
    return estimate / n, bound / n


def certified_tau(
    taus: np.ndarray, estimate: np.ndarray, bound: np.ndarray, max_risk: float, max_bound: float
) -> float:
    """The most permissive of ``taus`` (strictest first), tested in that order
    (fixed-sequence), whose estimate stays at or below ``max_risk`` and whose bound at or
    below ``max_bound``; 1.0 accepts nothing and always passes."""
    fails = (estimate > max_risk) | (bound > max_bound + 1e-12)
    failing = np.nonzero(fails)[0]
    last = (failing[0] if len(failing) else len(taus)) - 1
    return float(taus[last]) if last >= 0 else 1.0
