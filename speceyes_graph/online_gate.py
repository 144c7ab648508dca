"""An online gate: tau moved by the labels production gives itself, so that the risk stays
at or below a target while the traffic drifts.

**Risk** is the share of queries whose accepted draft disagrees with what the agent would
answer: the accuracy given up against agent-only. A fixed tau gives a different risk on
each workload (the published 0.98: 1.2% of HR-Bench 4K queries, 4.4% of V*'s).

**Labels.** Every rejected draft is followed by the agent, so whether it agreed is known.
An accepted draft's answer goes to the user; a random share ``shadow_rate`` of them is
*shadow-verified* (the agent runs on it off the user's path) and so labelled. Scores are
known for every draft, labelled or not. So for any candidate tau ``t`` the queries of a
window whose draft scores above ``t`` split into those the gate rejected when they came
(disagreements counted exactly: ``D_r(t)``) and those it accepted (``A(t)`` of them, of
which ``S(t)`` shadowed, ``D_s(t)`` of those disagreeing). The window's risk at ``t`` is
estimated by stratification, ``(D_r + A * D_s / S) / n``: unbiased, whatever taus the gate
used while the window filled, because each accepted draft was shadowed by a coin of its own.

**Choosing tau.** What the gate does not know of its window is how many of the accepted
drafts it did not shadow disagree: it bounds their share above from the ``S`` it shadowed
(an Agresti-Coull interval at level ``delta``), so the window's risk at ``t`` is at most
``(D_r + A * q_upper) / n``. From the strictest candidate down (fixed-sequence testing, as
in :mod:`~speceyes_graph.calibration`'s Learn-then-Test) tau is the most permissive ``t``
whose bound stays at or below ``max_risk``: the gate never accepts more than its evidence
supports. It starts from a given tau (the published 0.98, a gate file's, the label-free
estimate) and keeps it until the window holds ``warmup`` queries.

**What is guaranteed, and under which assumptions.** For the window itself, if shadow
runs fail independently of their outcome, the risk tau would have had on it is at most
``max_risk`` with probability about ``1 - delta`` (a normal approximation with a
small-sample correction, not exact). The next queries differ from the window by sampling
noise and by drift: the gate reacts within about a window, and its realised risk over
windows of the stream, measured by simulation with abrupt and gradual drift and by replay
of real-format results, is written with its tolerance in ``docs/calibration.md``. Bounding
the next queries too (a second interval over ``n``) kept every window under the target in
simulation, but accepted 11-39% of what the best fixed tau in hindsight accepts: the
default trades that for about 0.6 of it. Why not adaptive conformal inference (Gibbs &
Candes 2021) or online risk control (Feldman et al. 2023): those bound the long-run
*average* risk under arbitrary drift by letting tau swing around the target, so a
deployment spends part of its time above it; the windowed bound stays under the target
whenever the recent past resembles the next queries, and pays for a change by accepting
less until the window has seen the new traffic.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["GateDecision", "OnlineGate", "default_taus", "upper_bound"]


def upper_bound(successes: np.ndarray, trials: np.ndarray, delta: float) -> np.ndarray:
    """Agresti-Coull upper confidence bounds on binomial proportions at level ``delta``
    (one-sided), elementwise; 1 where there are no trials. ``successes`` may be fractional
    (an estimated count)."""
    z = NormalDist().inv_cdf(1 - delta)
    trials = np.asarray(trials, dtype=float)
    centre = (np.asarray(successes, dtype=float) + z * z / 2) / (trials + z * z)
    spread = z * np.sqrt(np.clip(centre * (1 - centre), 0, None) / (trials + z * z))
    return np.where(trials > 0, np.minimum(1.0, centre + spread), 1.0)


def default_taus() -> list[float]:
    """Candidate taus on the acceptance score ``sigmoid(0.6 * S)``: every 0.01 from 0.50,
    then every 0.001 above 0.95, where the published gates sit."""
    coarse = [round(0.50 + 0.01 * i, 3) for i in range(46)]
    fine = [round(0.95 + 0.001 * i, 4) for i in range(50)]
    return sorted(set(coarse + fine))


@dataclass(frozen=True)
class GateDecision:
    """What the gate said for one draft: accepted at ``tau``, and shadowed (the agent runs
    on it anyway, off the user's path, to label it) with chance ``shadow_rate``."""

    accepted: bool
    shadowed: bool
    tau: float


@dataclass(frozen=True)
class _Query:
    score: float | None  # None: no draft (the judge sent the query to the agent)
    accepted: bool  # when it came
    disagrees: bool | None  # None: no label (accepted and not shadowed, or the shadow failed)


class OnlineGate:
    """A gate whose tau follows the recent traffic (see the module docstring).

    Args:
        max_risk: the target: at most this share of queries answered by an accepted draft
            that disagrees with the agent.
        shadow_rate: the share of accepted drafts the agent verifies off the user's path.
        delta: the level of each window's bound.
        window: how many recent queries the estimate uses.
        tau: where it starts (the published 0.98, or a gate file's tau).
        warmup: queries seen before tau moves from ``tau``.
        taus: the candidate taus (default :func:`default_taus`).
        seed: for the shadow draws (None: random).

    Thread-safe: one gate serves every query of a process.
    """

    def __init__(
        self,
        max_risk: float = 0.02,
        shadow_rate: float = 0.1,
        *,
        delta: float = 0.1,
        window: int = 2000,
        tau: float = 0.98,
        warmup: int = 200,
        taus: Sequence[float] | None = None,
        seed: int | None = None,
    ) -> None:
        if not 0 < max_risk < 1:
            raise ValueError(f"max_risk must be in (0, 1), got {max_risk}")
        if not 0 < shadow_rate <= 1:
            raise ValueError(f"shadow_rate must be in (0, 1], got {shadow_rate}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if window < 2 or warmup < 0:
            raise ValueError(f"window must be at least 2 and warmup at least 0: {window}, {warmup}")
        self.max_risk, self.shadow_rate, self.delta = max_risk, shadow_rate, delta
        self.window, self.warmup, self.start_tau = window, warmup, tau
        grid = default_taus() if taus is None else taus
        self.taus = np.array(sorted({float(t) for t in grid} | {1.0}, reverse=True))
        self.tau = tau
        self.seen = 0
        self._queries: deque[_Query] = deque(maxlen=window)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def decide(self, score: float | None) -> GateDecision:
        """Gate one draft's acceptance score at the current tau; draw whether to shadow it."""
        with self._lock:
            tau = self.tau
            accepted = score is not None and score > tau
            shadowed = accepted and self._rng.random() < self.shadow_rate
        return GateDecision(accepted, shadowed, tau)

    def observe(
        self, decision: GateDecision | None, score: float | None, disagrees: bool | None
    ) -> None:
        """One query's outcome: its decision (None: it had no draft), its score and whether
        the draft disagreed with the agent (None when no label was taken: an accepted draft
        not shadowed, or a shadow run that failed). Moves tau."""
        accepted = decision is not None and decision.accepted
        if accepted and decision is not None and not decision.shadowed:
            disagrees = None  # a label the gate did not ask for would bias the estimate
        with self._lock:
            self._queries.append(_Query(score, accepted, disagrees))
            self.seen += 1
            if self.seen >= self.warmup:
                self.tau = float(self._certified_tau())

    def risk_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(estimated risk, its upper bound) of the window at each candidate in ``taus``."""
        with self._lock:
            return self._bounds(list(self._queries))

    def _bounds(self, queries: list[_Query]) -> tuple[np.ndarray, np.ndarray]:
        n = len(queries)

        def above(scores: list[float]) -> np.ndarray:  # how many exceed each candidate
            ordered = np.sort(np.asarray(scores, dtype=float))
            return len(ordered) - np.searchsorted(ordered, self.taus, side="right")

        drafted = [(q.score, q) for q in queries if q.score is not None]
        lost = above([s for s, q in drafted if not q.accepted and q.disagrees])
        accepted = above([s for s, q in drafted if q.accepted])
        shadowed = above([s for s, q in drafted if q.accepted and q.disagrees is not None])
        wrong = above([s for s, q in drafted if q.accepted and q.disagrees])
        share = np.divide(wrong, shadowed, out=np.zeros(len(self.taus)), where=shadowed > 0)
        estimate = (lost + accepted * share) / max(n, 1)
        bound = (lost + accepted * upper_bound(wrong, shadowed, self.delta)) / max(n, 1)
        return estimate, bound

    def _certified_tau(self) -> float:
        """The most permissive candidate, from the strictest down, whose bound stays at or
        below ``max_risk`` (1.0 accepts nothing and always passes)."""
        _, bound = self._bounds(list(self._queries))
        failing = np.nonzero(bound > self.max_risk)[0]
        last = (failing[0] if len(failing) else len(self.taus)) - 1
        return float(self.taus[last]) if last >= 0 else 1.0

    def state(self) -> dict[str, Any]:
        """What a run records of the gate: the tau now and the evidence behind it."""
        with self._lock:
            queries = list(self._queries)
        return {
            "tau": self.tau,
            "seen": self.seen,
            "window": len(queries),
            "labelled": sum(q.disagrees is not None for q in queries if q.score is not None),
            "shadowed": sum(q.accepted and q.disagrees is not None for q in queries),
            "max_risk": self.max_risk,
            "shadow_rate": self.shadow_rate,
        }
