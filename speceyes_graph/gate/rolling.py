"""Rolling risk control: the long-run alternative to the windowed gate.

Rolling risk control (Feldman, Ringel, Bates & Romano 2023; adaptive conformal inference,
Gibbs & Candes 2021, is its coverage case) moves one number after every query against the
loss that query had *at the tau it was gated with*, so no window and no bound are needed:

    position <- position + step * (max_risk - loss)

``position`` runs along the gate's candidate taus (0 is the strictest; a unit is one
candidate), so a step means the same on every workload's score scale. A query's loss is
whether its accepted draft disagreed with the agent, weighted by the inverse of the chance it
was shadowed with (0 when it was accepted and not shadowed, or not accepted): unbiased for
the true loss whatever the chance, given the past.

**What it guarantees.** Telescoping the update, for any order of queries (drift of any
kind, adversarial included), over the ``T`` queries a process gated::

    mean loss - max_risk = (position at the start - position at the end) / (step * T)

The position cannot fall below ``-step * max_loss`` (at 0 nothing is accepted, so nothing
is lost, and it only rises), and capping it at the last candidate plus a step only removes
rises, so the average weighted loss is at most ``max_risk + (start + step * max_loss) /
(step * T)``, ``max_loss`` the inverse of the smallest shadow chance;
its expectation over the shadow coins is the realised average risk. So the *long-run
average* risk over a process's queries converges to the target at rate ``1/T``, with no
level and no promise for any stretch of traffic: after a change it runs above the target
until its losses push tau back up. Each worker of a fleet runs its own controller on its
own queries; the fleet's average is the average of theirs. Rejected drafts' labels do not
move it (they carry no loss at the tau that rejected them).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from cachetools import FIFOCache

__all__ = ["RollingControl"]


class RollingControl:
    """Where rolling risk control has tau now (thread-safe; one per gate).

    Args:
        taus: the candidate taus (1.0, accepting nothing, is added).
        max_risk: the target average risk.
        step: how far (in candidates) one unit of loss moves it; a disagreeing draft shadowed
            with chance ``p`` moves it ``step / p`` stricter, every query ``step * max_risk``
            more permissive.
        start: the tau it starts from (the nearest candidate at or above it).
        memory: how many queries' keys it remembers (a label arriving later than that
            many queries is not applied).
    """

    def __init__(
        self,
        taus: Sequence[float],
        max_risk: float,
        step: float,
        start: float,
        memory: int = 100_000,
    ) -> None:
        if not step > 0:
            raise ValueError(f"step must be positive, got {step}")
        self.taus = sorted({float(t) for t in taus} | {1.0}, reverse=True)  # strictest first
        self.max_risk, self.step = max_risk, step
        self.position = float(self.index_of(start))
        self.losses = 0.0  # the weighted losses it has seen, and over how many queries
        self.queries = 0
        self._seen: FIFOCache[str, bool] = FIFOCache(memory)  # key -> its loss applied yet
        self._lock = threading.Lock()

    def index_of(self, tau: float) -> int:
        """The most permissive candidate at or above ``tau`` (0 when none is)."""
        at = [i for i, t in enumerate(self.taus) if t >= tau - 1e-12]
        return at[-1] if at else 0

    @property
    def tau(self) -> float:
        last = len(self.taus) - 1
        return self.taus[min(last, max(0, math.floor(self.position)))]

    def observe(self, key: str, accepted: bool, disagrees: bool | None, chance: float) -> float:
        """One query's outcome, by its key: counted once however often it is observed (a
        shadowed draft is observed when accepted and again with its label; a redelivered
        run again), its loss applied once, when its label comes. Returns tau afterwards."""
        with self._lock:
            done = self._seen.get(key)
            if done is None:  # a new query: every query moves it max_risk more permissive
                self.queries += 1
                self._move(self.max_risk)
                done = self._seen[key] = False
            if accepted and disagrees is not None and not done:
                loss = 1.0 / chance if disagrees else 0.0
                self.losses += loss
                self._move(-loss)
                self._seen[key] = True
            return self.tau

    def _move(self, amount: float) -> None:
        top = len(self.taus) - 1 + self.step  # past the last candidate it only falls back
        self.position = min(top, self.position + self.step * amount)

    def average_loss(self) -> float | None:
        """The weighted loss per query so far (its expectation: the realised risk)."""
        return self.losses / self.queries if self.queries else None
