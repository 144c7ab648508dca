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

**In the graph.** ``create_speceyes_graph(gate=OnlineGate(...))`` gates each tool-free
draft with :meth:`OnlineGate.decide` and records the tau it met and whether it was shadowed
in the query's ``draft``. A rejected draft is labelled by the agent's answer
(:func:`~speceyes_graph.answers.answers_agree`); a shadowed one by a shadow run of the
agent loop in :class:`ShadowRuns` (bounded threads and queue, off the user's path: the
answer has already returned); a query the judge sent to the tools counts in the window
without a draft. Where observations live is the gate's ledger
(:mod:`speceyes_graph.ledger`): this process's memory, or the run's LangGraph store, which
every worker of a deployment shares.

**It trusts only what it wrote, and fails safe.** A shared store is reachable by anyone who
can reach the server's API, so the gate counts only entries signed with the deployment's key
(``SPECEYES_GATE_KEY``, :mod:`speceyes_graph.gate_keys`) and valid field by field; without a
key it refuses the store and keeps its evidence in this process. When it cannot write or
read the fleet's labels, or has not read them for a while, its tau is at least
``outage_tau`` (its start tau by default) until it can again; evidence older than
``max_age_s`` does not count. A draft whose agent failed after a rejection counts as
disagreeing: a failure gives no agreement (docs/calibration.md, "What it trusts").
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
from langgraph.store.base import BaseStore

from .gate_keys import GateKeys, MissingGateKey
from .ledger import GateLedger, MemoryLedger, Observation, StoreLedger
from .separability import GateConfig

__all__ = [
    "GateDecision",
    "OnlineGate",
    "ShadowRuns",
    "default_taus",
    "upper_bound",
]

log = logging.getLogger(__name__)


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
    on it anyway, off the user's path, to label it) with chance ``shadow_rate``; ``at``:
    when (it orders the gate's window); ``risk`` and ``risk_bound``: the window's estimated
    risk at ``tau`` and its upper bound then (None before the warm-up ends)."""

    accepted: bool
    shadowed: bool
    tau: float
    at: float = 0.0
    risk: float | None = None
    risk_bound: float | None = None


def _settled(queries: list[Observation]) -> list[Observation]:
    """The window without the drafts whose shadow run is still under way: they join it with
    their label (a shadow that fails or finds no room joins it as an unshadowed accepted
    draft). Counting them meanwhile as unlabelled accepted drafts would make the gate pay
    for the shadows' latency: after a burst of acceptances the bound rises until their
    labels land, and tau swings. Leaving them out is unbiased while how long a shadow takes
    is independent of its outcome; a worker killed with shadows in flight leaves theirs out
    for good."""
    return [q for q in queries if not (q.shadowed and q.disagrees is None)]


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

    def submit(self, run: Callable[[], bool], done: Callable[[bool | None], None]) -> bool:
        """Start ``run`` (it returns whether the draft disagrees); ``done`` gets its label,
        or None when it failed. False: no room, the shadow was dropped."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.counts["dropped"] += 1
            done(None)
            return False
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, "speceyes-shadow")
            self.counts["started"] += 1
            future = self._pool.submit(self._run, run, done)
            self._running.add(future)
        future.add_done_callback(self._finished)
        return True

    def _run(self, run: Callable[[], bool], done: Callable[[bool | None], None]) -> None:
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
            done(label)
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


class OnlineGate:
    """A gate whose tau follows the recent traffic (see the module docstring).

    Args:
        max_risk: the target: at most this share of queries answered by an accepted draft
            that disagrees with the agent.
        shadow_rate: the share of accepted drafts the agent verifies off the user's path.
        delta: the level of each window's bound.
        window: how many recent queries the estimate uses.
        tau: where it starts; default the ``config``'s tau (the published 0.98, a gate
            file's, the label-free estimate of ``speceyes calibrate --unlabelled``).
        config: the score it gates (K, aggregation, alpha) and its starting tau: a
            :class:`~speceyes_graph.separability.GateConfig` or a gate file's path.
        warmup: queries in the window before tau moves from where it started.
        taus: the candidate taus (default :func:`default_taus`).
        seed: for the shadow draws (None: random).
        store: where the observations live. ``"run"`` (default): the run's LangGraph store
            when the graph has one (``langgraph dev``, Aegra, LangGraph Platform, or
            ``compile(store=...)``), so every worker shares one gate; else this process's
            memory. None: always this process's memory. A ``BaseStore``: that store.
        namespace: the gate's name in the store (one per gate of a deployment).
        shadow_concurrency: shadow runs at once (:class:`ShadowRuns`).
        shadow_queue: shadow runs waiting; past that a shadow is dropped (its label lost).
        sync_s: how often a worker reads the other workers' observations.
        key: the secret that signs the gate's entries in a shared store, the same on every
            worker (a list: the first signs, all verify, for rotation); default
            ``SPECEYES_GATE_KEY``. Without one a gate refuses a shared store.
        outage_tau: the least tau while the fleet's labels cannot be written or read, or
            have not been read for a while (default the start tau; 1.0 accepts nothing).
        max_age_s: observations older than this do not count (default a week; None: no
            limit).

    Thread-safe: one gate serves every query of a process.
    """

    def __init__(
        self,
        max_risk: float = 0.02,
        shadow_rate: float = 0.1,
        *,
        delta: float = 0.1,
        window: int = 2000,
        tau: float | None = None,
        config: GateConfig | str | Path | None = None,
        warmup: int = 200,
        taus: Sequence[float] | None = None,
        seed: int | None = None,
        store: BaseStore | Literal["run"] | None = "run",
        namespace: str = "default",
        shadow_concurrency: int = 2,
        shadow_queue: int = 64,
        sync_s: float = 1.0,
        key: str | bytes | Sequence[str | bytes] | None = None,
        outage_tau: float | None = None,
        max_age_s: float | None = 7 * 86400.0,
    ) -> None:
        if not 0 < max_risk < 1:
            raise ValueError(f"max_risk must be in (0, 1), got {max_risk}")
        if not 0 < shadow_rate <= 1:
            raise ValueError(f"shadow_rate must be in (0, 1], got {shadow_rate}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if window < 2 or not 0 <= warmup <= window:
            raise ValueError(f"window must be at least 2, warmup in 0..window: {window}, {warmup}")
        if max_age_s is not None and not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive or None, got {max_age_s}")
        config = GateConfig.load(config) if isinstance(config, (str, Path)) else config
        self.config = (config or GateConfig()).replace(**({} if tau is None else {"tau": tau}))
        self.max_risk, self.shadow_rate, self.delta = max_risk, shadow_rate, delta
        self.window, self.warmup, self.start_tau = window, warmup, self.config.tau
        self.outage_tau = self.start_tau if outage_tau is None else outage_tau
        if not 0 <= self.outage_tau <= 1:
            raise ValueError(f"outage_tau must be in [0, 1], got {self.outage_tau}")
        self.max_age_s = max_age_s
        grid = default_taus() if taus is None else taus
        self.taus = np.array(sorted({float(t) for t in grid} | {1.0}, reverse=True))
        self.tau = self.start_tau
        self.risk: float | None = None  # the window's estimate at tau, and its bound
        self.risk_bound: float | None = None
        self.trouble: str | None = None  # why the gate is tightened now, if it is
        self.refused: str | None = None  # why it keeps to this process's memory, if it does
        self.seen = 0  # observations this process made
        self.namespace, self.sync_s = namespace, sync_s
        self.keys = GateKeys(key) if key is not None else GateKeys.from_env()
        self._store_choice = store
        if isinstance(store, BaseStore) and self.keys is None:
            raise MissingGateKey("OnlineGate(store=...)")
        self.ledger: GateLedger = (
            self._store_ledger(store) if isinstance(store, BaseStore) else MemoryLedger(window)
        )
        self.shadows = ShadowRuns(shadow_concurrency, shadow_queue)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _namespace(self) -> tuple[str, ...]:
        return ("speceyes", "online_gate", self.namespace)

    def _store_ledger(self, store: BaseStore) -> StoreLedger:
        assert self.keys is not None
        return StoreLedger(store, self._namespace(), self.window, self.keys, sync_s=self.sync_s)

    # --- where observations live ---------------------------------------------------------------
    def bind(self, store: BaseStore | None) -> None:
        """Share the run's store (``runtime.store``), if the gate was told to (``store="run"``)
        and is not bound yet; the graph's nodes call this. Without a key the store is
        refused (once, logged, in :meth:`state`): the gate keeps to this process."""
        if store is None or self._store_choice != "run" or self.ledger.shared or self.refused:
            return
        with self._lock:
            if self.ledger.shared or self.refused:
                return
            if self.keys is None:
                self.refused = str(MissingGateKey(f"online gate {self.namespace!r}"))
                log.error("%s; until then it keeps its evidence in this process", self.refused)
                return
            self.ledger = self._store_ledger(store)
            log.info("online gate %r shares the run's store", self.namespace)

    def stale(self) -> bool:
        """Whether other workers' observations should be read before the next decision."""
        return self.ledger.stale()

    def refresh(self) -> None:
        """Read other workers' observations (blocking I/O: off the event loop) and refit.
        A failed read never raises here: the gate tightens until a read succeeds."""
        try:
            self.ledger.sync()
        except Exception:  # the ledger's trouble() says what failed
            pass
        self._refit()

    # --- gating and labels ---------------------------------------------------------------------
    def decide(self, score: float | None) -> GateDecision:
        """Gate one draft's acceptance score at the current tau; draw whether to shadow it."""
        with self._lock:
            tau, risk, bound = self.tau, self.risk, self.risk_bound
            accepted = score is not None and score > tau
            shadowed = accepted and self._rng.random() < self.shadow_rate
        return GateDecision(accepted, shadowed, tau, time.time(), risk, bound)

    def observe(
        self,
        decision: GateDecision | None,
        score: float | None,
        disagrees: bool | None,
        key: str | None = None,
        *,
        agent_failed: bool = False,
    ) -> None:
        """One query's outcome: its decision (None: it had no draft), its score and whether
        the draft disagreed with the agent (None when no label was taken: an accepted draft
        not shadowed, a shadow run still running or failed). ``agent_failed``: a rejected
        draft whose agent failed, counted as disagreeing. ``key``: the query's own (a run
        redelivered, or a shadow's label arriving later, replaces its entry). Moves tau;
        raises what the store raised (the gate is tightened then)."""
        accepted = decision is not None and decision.accepted
        shadowed = decision is not None and decision.shadowed
        if accepted and not shadowed:
            disagrees = None  # a label the gate did not ask for would bias the estimate
        failed = agent_failed and not accepted and score is not None
        if failed:
            disagrees = True
        at = decision.at if decision is not None and decision.at else time.time()
        observation = Observation(at, score, accepted, shadowed, disagrees, failed)
        try:
            self.ledger.record(key or uuid.uuid4().hex, observation)
            with self._lock:
                self.seen += 1
        finally:
            self._refit()

    def _evidence(self) -> list[Observation]:
        """The window as it counts: settled, and no older than ``max_age_s``."""
        queries = _settled(self.ledger.recent())
        if self.max_age_s is None:
            return queries
        oldest = time.time() - self.max_age_s
        return [q for q in queries if q.at >= oldest]

    def _refit(self) -> None:
        recent = self._evidence()
        trouble = self.ledger.trouble()
        tau, estimate, bound = self.start_tau, None, None
        if len(recent) >= self.warmup:
            estimates, bounds = self._bounds(recent)
            tau = self._certified_tau(bounds)
            if trouble is not None:  # fail safe: no permissive tau without live evidence
                tau = max(tau, self.outage_tau)
            at = int(np.searchsorted(-self.taus, -tau))  # taus run from 1.0 down
            if at < len(self.taus) and self.taus[at] == tau:
                estimate, bound = float(estimates[at]), float(bounds[at])
        elif trouble is not None:
            tau = max(tau, self.outage_tau)
        with self._lock:
            before, self.trouble = self.trouble, trouble
            self.tau, self.risk, self.risk_bound = tau, estimate, bound
        if trouble != before:
            if trouble is None:
                log.info("online gate %r reads and writes its labels again", self.namespace)
            elif before is None:
                log.warning(
                    "online gate %r tightened to tau >= %s: %s",
                    self.namespace, self.outage_tau, trouble,
                )  # fmt: skip

    def risk_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(estimated risk, its upper bound) of the window at each candidate in ``taus``."""
        return self._bounds(self._evidence())

    def _bounds(self, queries: list[Observation]) -> tuple[np.ndarray, np.ndarray]:
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

    def _certified_tau(self, bound: np.ndarray) -> float:
        """The most permissive candidate, from the strictest down, whose bound stays at or
        below ``max_risk`` (1.0 accepts nothing and always passes)."""
        failing = np.nonzero(bound > self.max_risk)[0]
        last = (failing[0] if len(failing) else len(self.taus)) - 1
        return float(self.taus[last]) if last >= 0 else 1.0

    def state(self) -> dict[str, Any]:
        """What a run records of the gate: the tau now, the evidence behind it, what it
        would not count, why it is tightened or keeps to this process, the shadow runs'
        cost. What an operator watches."""
        queries = self.ledger.recent()
        return {
            "tau": self.tau,
            "start_tau": self.start_tau,
            "seen": self.seen,
            "window": len(queries),
            "pending": len(queries) - len(_settled(queries)),
            "labelled": sum(q.disagrees is not None for q in queries if q.score is not None),
            "shadowed": sum(q.accepted and q.disagrees is not None for q in queries),
            "agent_failures": sum(q.failed for q in queries),
            "max_risk": self.max_risk,
            "shadow_rate": self.shadow_rate,
            "shared": self.ledger.shared,
            "skipped": dict(self.ledger.skipped),
            "trouble": self.trouble,
            "tightened": self.trouble is not None,
            "refused": self.refused,
            "shadow_runs": self.shadows.stats(),
        }
