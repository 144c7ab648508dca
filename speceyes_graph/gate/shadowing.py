"""Shadowing: which accepted drafts the agent verifies off the user's path, and running it.

An accepted draft's answer goes to the user; whether it agrees with the agent is known only
if the agent runs on it anyway: a *shadow run*. A :class:`ShadowPolicy` gives each accepted
draft its chance of one, before the coin is drawn; the gate keeps that chance with the
draft and weighs the labels by it, so its estimate stays unbiased whatever the policy (the
drafts shadowed at one chance are a uniform sample of those accepted at it). Two policies:

- :class:`FlatShadows`: the same chance for every accepted draft;
- :class:`BudgetShadows`: a budget of shadow runs per query, spent on however many drafts
  the gate accepts now: few acceptances (a cautious gate, a new deployment, traffic that
  turned hard) are shadowed at a high chance, so the gate learns fast where it knows least;
  many at a low one. Its chances come from a short ladder, each a group of its own in the
  gate's bound.

- :class:`MarginShadows`: by the draft's score: drafts just above tau, where nearly all
  disagreements sit, at one chance, those far above it at a lower one.

Any other policy is a class with ``levels`` and ``chance``. What each costs in acceptance
and agent calls, and why a low chance has a floor no policy escapes, is measured in
docs/calibration.md ("Shadow policies"). :class:`ShadowRuns` runs the shadows: bounded
threads and queue, off the user's path, each run's cost counted.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any, Protocol

from .separability import DEFAULT_ALPHA, separability_of

__all__ = [
    "BudgetShadows",
    "FlatShadows",
    "LabelFlow",
    "MarginShadows",
    "ShadowPolicy",
    "ShadowRuns",
    "shadow_policy",
]

log = logging.getLogger(__name__)


class ShadowPolicy(Protocol):
    """How likely an accepted draft is to be shadowed.

    ``levels``: every chance the policy may give (the gate's bound splits its level over
    them); ``chance``: the one for this draft, from its score, the gate's tau and the share
    of recent queries it accepted. Called before the coin: a chance must not depend on the
    draft's label."""

    @property
    def levels(self) -> tuple[float, ...]: ...

    def chance(self, score: float, tau: float, acceptance: float) -> float: ...


@dataclass(frozen=True)
class FlatShadows:
    """Every accepted draft shadowed with chance ``rate``."""

    rate: float

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1:
            raise ValueError(f"a shadow rate must be in (0, 1], got {self.rate}")

    @property
    def levels(self) -> tuple[float, ...]:
        return (self.rate,)

    def chance(self, score: float, tau: float, acceptance: float) -> float:
        return self.rate


@dataclass(frozen=True)
class BudgetShadows:
    """About ``budget`` shadow runs per query: an accepted draft is shadowed with the chance
    of ``ladder`` nearest (in ratio) to ``budget / acceptance``, the share of recent
    queries the gate accepted; the ladder's largest while the gate accepts so few that
    even every one fits the budget."""

    budget: float
    ladder: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)

    def __post_init__(self) -> None:
        if not 0 < self.budget <= 1:
            raise ValueError(f"a shadow budget must be in (0, 1] runs per query: {self.budget}")
        if not self.ladder or not all(0 < c <= 1 for c in self.ladder):
            raise ValueError(f"the ladder's chances must be in (0, 1]: {self.ladder}")

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(sorted(set(self.ladder), reverse=True))

    def chance(self, score: float, tau: float, acceptance: float) -> float:
        wanted = self.budget / acceptance if acceptance > 0 else 1.0
        return min(self.levels, key=lambda c: abs(math.log(c / min(wanted, 1.0))))


@dataclass(frozen=True)
class MarginShadows:
    """Drafts whose separability is within ``margin`` of tau's shadowed with chance
    ``near``, the rest with ``far``: labels where the disagreements are, and where a change
    of traffic first shows (``MarginShadows(1.0, 0.3)`` kept the risk within the tolerance
    through every simulated change, for about 0.1 agent calls per query more than the
    default). A low ``far`` saves little: a group shadowed at chance ``far`` cannot be
    certified below ``ln(1/delta) / -ln(1 - far)`` disagreements however few it holds
    (docs/calibration.md, "Shadow policies")."""

    near: float
    far: float
    margin: float = 1.5
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if not (0 < self.far <= 1 and 0 < self.near <= 1):
            raise ValueError(f"shadow chances must be in (0, 1]: {self.near}, {self.far}")
        if not self.margin > 0:
            raise ValueError(f"the margin is a positive separability: {self.margin}")

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(sorted({self.near, self.far}, reverse=True))

    def chance(self, score: float, tau: float, acceptance: float) -> float:
        above = separability_of(score, self.alpha) - separability_of(tau, self.alpha)
        return self.near if above < self.margin else self.far


def shadow_policy(spec: float | ShadowPolicy) -> ShadowPolicy:
    """A policy as the gate takes it: a number is a flat rate."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return FlatShadows(float(spec))
    if isinstance(spec, bool) or not hasattr(spec, "chance") or not hasattr(spec, "levels"):
        raise TypeError(f"a shadow policy has levels and chance(): got {spec!r}")
    return spec


class ShadowRuns:
    """Shadow verification off the user's path: at most ``concurrency`` runs at once in
    threads of their own and ``queue`` more waiting; past that a shadow is dropped (its
    label is lost, nothing else; counted). Each run's cost is counted: runs, seconds,
    failures."""

    def __init__(self, concurrency: int = 2, queue: int = 64) -> None:
        if concurrency < 1 or queue < 0:
            raise ValueError(f"concurrency must be >= 1 and queue >= 0: {concurrency}, {queue}")
        self.concurrency, self.queue = concurrency, queue
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(concurrency + queue)
        self._lock = threading.Lock()
        self._running: set[Future[None]] = set()
        self.counts = {"started": 0, "labelled": 0, "failed": 0, "dropped": 0}
        self.seconds = 0.0

    def submit(self, run: Callable[[], bool], done: Callable[[bool | None, bool], None]) -> bool:
        """Start ``run`` (it returns whether the draft disagrees); ``done`` gets its label
        (None when it failed) and whether it was dropped. False: no room, the shadow was
        dropped (``done(None, True)`` at once)."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.counts["dropped"] += 1
            done(None, True)
            return False
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, "speceyes-shadow")
            self.counts["started"] += 1
            future = self._pool.submit(self._run, run, done)
            self._running.add(future)
        future.add_done_callback(self._finished)
        return True

    def _run(self, run: Callable[[], bool], done: Callable[[bool | None, bool], None]) -> None:
        t0 = time.perf_counter()
        label: bool | None = None
        try:
            label = bool(run())
        except Exception as exc:  # a failed shadow loses only its label
            log.info("shadow run failed: %s: %s", type(exc).__name__, exc)
        with self._lock:
            self.seconds += time.perf_counter() - t0
            self.counts["labelled" if label is not None else "failed"] += 1
        try:
            done(label, False)
        except Exception:
            log.exception("recording a shadow run's label failed")

    def _finished(self, future: Future[None]) -> None:
        with self._lock:
            self._running.discard(future)
        self._slots.release()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the shadow runs in flight (a CLI before it exits, a test); True if none
        is left."""
        with self._lock:
            running = set(self._running)
        _, pending = wait_for(running, timeout=timeout)
        return not pending

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self.counts, "running": len(self._running), "seconds": self.seconds}


class LabelFlow:
    """Whether shadow runs still give labels: the outcomes of this worker's last ``stretch``
    shadow coins that came up, each labelled or lost.

    A lost shadow joins the window as an accepted draft without a label, which keeps the
    estimate unbiased only while losses are independent of the label, and teaches the
    gate nothing: with every shadow failing, a gate that learnt a low tau would keep it
    while the traffic turned wrong. So more than ``tolerance`` of the stretch lost (and at
    least ``least`` shadows) is trouble, as a store outage is: the gate tightens to its
    ``outage_tau`` until labels flow again, which *probes* show (the gate shadows drafts it
    would have accepted, at its policy's chance, while it rejects them; their labels count
    only here).

    A run that failed is lost. A shadow dropped for want of room is lost only while no run
    has given a label for ``stall_s``: under load the queue drops shadows in bursts while
    the runs in it keep labelling (the demo drops a fifth of its shadows so), and a drop
    that depends only on load leaves the estimate unbiased; a queue that drops because its
    runs hang does not label at all."""

    def __init__(
        self, stretch: int = 10, tolerance: float = 0.5, least: int = 5, stall_s: float = 60.0
    ) -> None:
        if stretch < 1 or not 0 <= tolerance < 1 or least < 1 or not stall_s > 0:
            raise ValueError(
                "stretch >= 1, tolerance in [0, 1), least >= 1, stall_s > 0: "
                f"{stretch}, {tolerance}, {least}, {stall_s}"
            )
        self.tolerance, self.least, self.stall_s = tolerance, least, stall_s
        self._outcomes: deque[bool] = deque(maxlen=stretch)
        self._labelled_at = time.monotonic()  # a new worker's queue is not stalled
        self._lock = threading.Lock()

    def add(self, labelled: bool | None) -> None:
        """A shadow's outcome: labelled (True), its run failed (False), dropped (None)."""
        now = time.monotonic()
        with self._lock:
            if labelled:
                self._labelled_at = now
            if labelled is not None or now - self._labelled_at > self.stall_s:
                self._outcomes.append(bool(labelled))

    def trouble(self) -> str | None:
        with self._lock:
            n, lost = len(self._outcomes), self._outcomes.count(False)
        if lost >= self.least and lost > self.tolerance * n:
            return f"shadow runs give no labels: {lost} of the last {n} failed or stalled"
        return None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"stretch": len(self._outcomes), "lost": self._outcomes.count(False)}
