"""An online gate: tau moved by the labels production gives itself, so that the risk stays
at or below a target while the traffic drifts.

**Risk** is the share of queries whose accepted draft disagrees with what the agent would
answer: the accuracy given up against agent-only. A fixed tau gives a different risk on
each workload (the published 0.98's, replayed on the official outputs: docs/calibration.md).

**Labels.** Every rejected draft is followed by the agent, so whether it agreed is known.
An accepted draft's answer goes to the user; it is *shadow-verified* (the agent runs on it
off the user's path) with a chance its shadow policy gives it before the coin is drawn
(:mod:`~speceyes_graph.gate.shadowing`: flat by default, a budget of shadow runs per query, or
by the draft's score), and the chance stays with the draft. Scores are known for every draft, labelled or
not. So for any candidate tau ``t`` the queries of a window whose draft scores above ``t``
split into those the gate rejected when they came (disagreements counted exactly) and
those it accepted; the accepted ones, grouped by the chance they were shadowed with, are
estimated group by group from their shadowed members, a uniform sample of the group: the
estimate is unbiased whatever taus the gate used while the window filled.

**Choosing tau.** From the strictest candidate down (fixed-sequence testing, as in
:mod:`~speceyes_graph.gate.calibration`'s Learn-then-Test) tau is the most permissive ``t`` whose
estimated window risk is at most ``max_risk`` and whose exact upper bound (per group, on
its disagreements given its shadowed sample, drawn without replacement: the hypergeometric
test inverted, at level ``delta`` split over the policy's chances) is at most ``tolerance *
max_risk``. With no evidence it starts at 1.0 and accepts nothing for its warm-up
(``ceil(ln(1/delta) / max_risk)`` queries, all labelled by the agent); a gate file's
labelled calibration queries (``evidence``) seed the window instead, so it is guarded and
accepting from its first query.

**What is guaranteed, and under which assumptions.** With probability at least
``1 - delta`` over the shadow coins, the risk the chosen tau would have had on the window's
queries is at most ``tolerance * max_risk`` (exact given how many of each group were shadowed;
conservative only by the counts' discreteness), if a draft's chance does not depend on its label, shadow runs fail
independently of their outcome, and given which drafts the gate accepted. The next queries
differ from the window by sampling noise and by drift: the gate reacts within about a
window, and its realised risk, its acceptance against the best fixed tau in hindsight and
its agent calls, measured on simulated traffic with abrupt and gradual drift, are in
``docs/calibration.md``. ``RiskOptions(rolling_step=...)`` swaps the window's certified tau
for rolling risk control (:mod:`~speceyes_graph.gate.rolling`): the long-run *average* risk bounded
under any drift, with no level for any stretch of traffic.

**In the graph.** ``create_speceyes_graph(gate=OnlineGate(...))`` gates each tool-free
draft with :meth:`OnlineGate.decide` and records the tau it met and whether it was shadowed
in the query's ``draft``. A rejected draft is labelled by the agent's answer
(:func:`~speceyes_graph.answers.answers_agree`); a shadowed one by a shadow run of the
agent loop in :class:`ShadowRuns` (bounded threads and queue, off the user's path: the
answer has already returned); a query the judge sent to the tools counts in the window,
without a draft, once its agent answered. Only runs under the deployment's settings count,
a label is an agent's verdict (:mod:`~speceyes_graph.gate.online_steps`), and one source
holds at most ``max_share`` of the window. Where observations live is the gate's ledger
(:mod:`speceyes_graph.gate.ledger`): this process's memory, or the run's LangGraph store, which
every worker of a deployment shares.

**It trusts only what it wrote, and fails safe.** A shared store is reachable by anyone who
can reach the server's API, so the gate counts only entries signed with the deployment's key
(``SPECEYES_GATE_KEY``, :mod:`speceyes_graph.gate.keys`) and valid field by field; without a
key it refuses the store and keeps its evidence in this process. When it cannot write or
read the fleet's labels, or has not read them for a while, its tau is at least
``outage_tau`` (its start tau by default) until it can again; evidence older than
``max_age_s`` does not count. A draft whose agent was down after a rejection counts as
disagreeing: an outage gives no agreement (docs/calibration.md, "What it trusts").
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from langgraph.store.base import BaseStore

from .bounds import count_upper_bound, upper_bound
from .gate_options import DEFAULT_WINDOW, LabelOptions, RiskOptions, TrustOptions
from .keys import GateKeys, MissingGateKey
from .ledger import MIN_CHANCE, GateLedger, MemoryLedger, Observation, StoreLedger
from .rolling import RollingControl
from .separability import GateConfig, acceptance_score, separability_of
from .shadowing import (
    BudgetShadows,
    FlatShadows,
    LabelFlow,
    MarginShadows,
    ShadowPolicy,
    ShadowRuns,
    shadow_policy,
)
from .window import certified_tau, settled, window_risk

__all__ = [
    "BudgetShadows",
    "DEFAULT_SHADOWS",
    "DEFAULT_WINDOW",
    "FlatShadows",
    "GateDecision",
    "LabelFlow",
    "LabelOptions",
    "MarginShadows",
    "OnlineGate",
    "RiskOptions",
    "ShadowPolicy",
    "ShadowRuns",
    "TrustOptions",
    "count_upper_bound",
    "default_taus",
    "read_evidence",
    "upper_bound",
]

log = logging.getLogger(__name__)


def default_taus() -> list[float]:
    """Candidate taus on the acceptance score ``sigmoid(0.6 * S)``: every 0.01 from 0.50,
    then every 0.001 above 0.95, where the published gates sit."""
    coarse = [round(0.50 + 0.01 * i, 3) for i in range(46)]
    fine = [round(0.95 + 0.001 * i, 4) for i in range(50)]
    return sorted(set(coarse + fine))


@dataclass(frozen=True)
class GateDecision:
    """What the gate said for one draft: accepted at ``tau``, and shadowed (the agent runs
    on it anyway, off the user's path, to label it) with chance ``chance``; ``at``: when
    (it orders the gate's window); ``risk`` and ``risk_bound``: the window's estimated risk
    at ``tau`` and its exact upper bound then (None while it has too few queries);
    ``probe``: rejected while shadows fail, and shadowed to see whether they work again
    (:class:`~speceyes_graph.gate.shadowing.LabelFlow`)."""

    accepted: bool
    shadowed: bool
    tau: float
    at: float = 0.0
    risk: float | None = None
    risk_bound: float | None = None
    chance: float = 1.0
    probe: bool = False


def read_evidence(path: str | Path) -> list[tuple[float | None, bool]]:
    """The labelled calibration queries a gate file keeps (``speceyes calibrate`` writes up
    to a window of them): (separability or None without a draft, disagrees).

    A file says its scale (``evidence_scale``); calibrate before it did kept acceptance
    scores, ``sigmoid(0.6 * S)``, which read as separability would all fall below 0.65 and
    seed a gate that certifies any tau: an unmarked file whose scores all lie in [0, 1] is
    read as that, and turned back into separability (logged)."""
    data = json.loads(Path(path).read_text())
    gate = data.get("gate", data)
    rows = gate.get("evidence") or []
    out: list[tuple[float | None, bool]] = []
    for row in rows:
        if not isinstance(row, (list, tuple)) or len(row) != 2 or type(row[1]) is not bool:
            raise ValueError(f"{path}: an evidence row is [separability or null, bool]: {row!r}")
        score = row[0]
        if score is not None and not (isinstance(score, (int, float)) and math.isfinite(score)):
            raise ValueError(f"{path}: an evidence score must be a finite number: {row!r}")
        out.append((None if score is None else float(score), row[1]))
    scale = gate.get("evidence_scale")
    if scale is None and out and all(0 <= s <= 1 for s, _ in out if s is not None):
        log.warning(
            "%s: evidence without a scale, every score in [0, 1]: read as acceptance scores "
            "(speceyes calibrate before evidence_scale); re-run calibrate to drop this guess",
            path,
        )
        scale = "acceptance"
    if scale not in (None, "separability", "acceptance"):
        raise ValueError(f"{path}: evidence_scale is 'separability' or 'acceptance': {scale!r}")
    if scale == "acceptance":
        out = [(None if s is None else separability_of(s), y) for s, y in out]
    return out


DEFAULT_SHADOWS: ShadowPolicy = FlatShadows(0.5)
"""The shadow policy a gate uses unless told otherwise (docs/calibration.md: measured)."""

ANONYMOUS = "anonymous"
"""The identity every caller of an open server has (``speceyes_graph.deploy.auth.auth``)."""


def _starting_point(
    config: GateConfig | str | Path | None,
    evidence: Sequence[tuple[float | None, bool]] | None,
    tau: float | None,
) -> tuple[GateConfig, Sequence[tuple[float | None, bool]] | None]:
    """The score a gate gates and the tau it starts from (``tau``, else the config's, else
    1.0: nothing accepted until certified), and its evidence: a gate file's unless
    ``evidence`` is given."""
    if isinstance(config, (str, Path)):
        evidence = read_evidence(config) if evidence is None else evidence
        config = GateConfig.load(config)
    start = tau if tau is not None else (config.tau if config is not None else 1.0)
    return (config or GateConfig()).replace(tau=start), evidence


class OnlineGate:
    """A gate whose tau follows the recent traffic (see the module docstring).

    Args:
        max_risk: the target: at most this share of queries answered by an accepted draft
            that disagrees with the agent, as the window estimates it.
        shadow_rate: which accepted drafts the agent verifies off the user's path: a
            :class:`~speceyes_graph.gate.shadowing.ShadowPolicy`, or a number for a flat chance
            (default :data:`DEFAULT_SHADOWS`).
        config: the score it gates (K, aggregation, alpha) and its starting tau: a
            :class:`~speceyes_graph.gate.separability.GateConfig` or a gate file's path (whose
            labelled ``evidence``, when it keeps some, seeds the window).
        evidence: labelled queries to start from, (separability or None, disagrees) each
            (:func:`read_evidence`): they fill the window until live traffic replaces them.
        tau: where it starts; default the ``config``'s tau when one is given (a gate file's,
            the label-free estimate of ``speceyes calibrate --unlabelled``), else 1.0: no
            draft is accepted until the window (or ``evidence``) certifies a tau.
        risk: the window the target is held on: tolerance, delta, its size, warm-up,
            candidate taus, rolling risk control, evidence's age (:class:`RiskOptions`).
        labels: the shadow runs that label accepted drafts (:class:`LabelOptions`).
        trust: where observations live, whose entries count, and the least tau while they
            cannot be vouched for (:class:`TrustOptions`).

    Each group checks its own values; the warm-up, whose default and range need
    ``max_risk``, is checked here. Thread-safe: one gate serves every query of a process.
    """

    def __init__(
        self,
        max_risk: float = 0.02,
        shadow_rate: float | ShadowPolicy | None = None,
        *,
        config: GateConfig | str | Path | None = None,
        evidence: Sequence[tuple[float | None, bool]] | None = None,
        tau: float | None = None,
        risk: RiskOptions | None = None,
        labels: LabelOptions | None = None,
        trust: TrustOptions | None = None,
    ) -> None:
        if not 0 < max_risk < 1:
            raise ValueError(f"max_risk must be in (0, 1), got {max_risk}")
        self.risk_options = risk = RiskOptions() if risk is None else risk
        self.label_options = labels = LabelOptions() if labels is None else labels
        self.trust_options = trust = TrustOptions() if trust is None else trust
        self.shadow = shadow_policy(DEFAULT_SHADOWS if shadow_rate is None else shadow_rate)
        self.config, evidence = _starting_point(config, evidence, tau)
        self.max_risk, self.start_tau = max_risk, self.config.tau
        self._apply_risk(risk)
        self._apply_labels(labels)
        self._apply_trust(trust)
        self.seeds = [  # the oldest of the window: fully labelled, as rejected drafts are
            Observation(0.0, None if s is None else acceptance_score(s, self.config.alpha),
                        False, False, None if s is None else bool(y))
            for s, y in list(evidence or [])[-self.window:]
        ]  # fmt: skip
        self.tau = self.start_tau
        self.risk: float | None = None  # the window's estimate at tau, and its bound
        self.risk_bound: float | None = None
        self.acceptance = 0.0  # the share of the window's queries accepted (for shadowing)
        # what tau rests on: the window's queries, its labelled drafts, those disagreeing
        self.counts = {"window": 0, "labelled": 0, "disagreeing": 0}
        self.trouble: str | None = None  # why the gate is tightened now, if it is
        self.refused: str | None = None  # why it keeps to this process's memory, if it does
        self.seen = 0  # observations this process made
        self.certified = self.tau  # the window's tau before any tightening
        self._lock = threading.Lock()
        self.rolling: RollingControl | None = None
        if self.seeds:
            self._refit()
        if risk.rolling_step is not None:
            self.rolling = RollingControl(
                list(self.taus), max_risk, risk.rolling_step, start=self.tau
            )

    def _apply_risk(self, risk: RiskOptions) -> None:
        """The window's settings, and its warm-up: the default and the range need the
        target, so they are checked here rather than by :class:`RiskOptions`."""
        warmup = risk.warmup
        if warmup is None:  # the fewest queries in which a bound can reach the target
            warmup = math.ceil(math.log(1 / risk.delta) / self.max_risk)
        if not 0 <= warmup <= risk.window:
            raise ValueError(f"warmup must be in 0..window ({risk.window}), got {warmup}")
        self.tolerance, self.delta = risk.tolerance, risk.delta
        self.window, self.warmup, self.max_age_s = risk.window, warmup, risk.max_age_s
        grid = default_taus() if risk.taus is None else risk.taus
        self.taus = np.array(sorted({float(t) for t in grid} | {1.0}, reverse=True))

    def _apply_labels(self, labels: LabelOptions) -> None:
        """The shadow runs, the judge of their label flow, and the coins they are drawn by."""
        self.shadow_patience_s = labels.patience_s
        self.shadows = ShadowRuns(labels.concurrency, labels.queue)
        self.label_flow = LabelFlow(labels.stretch, labels.loss)
        self._rng = random.Random(labels.seed)

    def _apply_trust(self, trust: TrustOptions) -> None:
        """Where the observations live, signed with which keys, capped per source; the
        least tau while they cannot be vouched for (by default the start tau, which must
        then be a tau in [0, 1] too)."""
        self.outage_tau = self.start_tau if trust.outage_tau is None else trust.outage_tau
        if not 0 <= self.outage_tau <= 1:
            raise ValueError(f"outage_tau must be in [0, 1], got {self.outage_tau}")
        self.namespace, self.sync_s = trust.namespace, trust.sync_s
        self.max_share, self.burst_s = trust.max_share, trust.burst_s
        share = trust.max_share
        self.cap = None if share is None else max(1, math.floor(share * self.window))
        self.keys = GateKeys(trust.key) if trust.key is not None else GateKeys.from_env()
        self._store_choice = trust.store
        if isinstance(trust.store, BaseStore) and self.keys is None:
            raise MissingGateKey("OnlineGate(trust=TrustOptions(store=...))")
        self.ledger: GateLedger = (
            self._store_ledger(trust.store)
            if isinstance(trust.store, BaseStore)
            else MemoryLedger(self.window, self.cap)
        )

    @property
    def scope(self) -> Literal["shared", "process"]:
        """Where its labels live: ``"shared"`` by every worker through the store, or kept
        to this ``"process"`` (no store, or no key to sign a shared one's entries)."""
        return "shared" if self.ledger.shared else "process"

    @property
    def shadow_rate(self) -> float:
        """The largest chance the shadow policy gives (its rate, for a flat one)."""
        return max(self.shadow.levels)

    def _namespace(self) -> tuple[str, ...]:
        return ("speceyes", "online_gate", self.namespace)

    def _store_ledger(self, store: BaseStore) -> StoreLedger:
        assert self.keys is not None
        return StoreLedger(
            store, self._namespace(), self.window, self.keys, sync_s=self.sync_s, cap=self.cap
        )

    def source(self, identity: str | None, served: bool, at: float | None = None) -> str:
        """Whose share of the window a query at ``at`` counts in (``max_share``,
        :class:`TrustOptions`): a digest of the caller's ``identity`` on a server with
        identities, the burst it arrived in on an open one (no identity, or
        ``"anonymous"``), "" in one process."""
        if not served:
            return ""
        if identity and identity != ANONYMOUS:
            return "id:" + hashlib.sha256(identity.encode()).hexdigest()[:24]
        return f"~{int((time.time() if at is None else at) // self.burst_s)}"

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
            # while shadows fail, a draft the window would have accepted is a probe
            probing = not accepted and score is not None and score > self.certified
            probing = probing and self.label_flow.trouble() is not None
            chance = 1.0
            if accepted or probing:
                assert score is not None
                # a probe's chance as the window's tau would have given it
                chance = self.shadow.chance(
                    score, tau if accepted else self.certified, self.acceptance
                )
                chance = min(1.0, max(MIN_CHANCE, float(chance)))
            coin = (accepted or probing) and self._rng.random() < chance
            if not accepted:
                chance = 1.0
        return GateDecision(
            accepted, accepted and coin, tau, time.time(), risk, bound, chance, probing and coin
        )

    def shadow_outcome(self, labelled: bool | None) -> None:
        """A shadow gave its label (True), its run failed (False), or it was dropped for want
        of room (None); moves tau (:class:`~speceyes_graph.gate.shadowing.LabelFlow`)."""
        self.label_flow.add(labelled)
        self._refit()

    def observe(
        self,
        decision: GateDecision | None,
        score: float | None,
        disagrees: bool | None,
        key: str | None = None,
        *,
        agent_failed: bool = False,
        bound: str = "",
        source: str = "",
    ) -> None:
        """One query's outcome: its decision (None: it had no draft), its score and whether
        the draft disagreed with the agent (None when no label was taken: an accepted draft
        not shadowed, a shadow run still running or failed). ``agent_failed``: a rejected
        draft whose agent was down, counted as disagreeing. ``key``: the query's own (a run
        redelivered, or a shadow's label arriving later, replaces its entry). ``bound``: a
        rejected draft's decision recorded before its label, with the digest of the draft
        (:mod:`~speceyes_graph.gate.online_steps`). ``source``: whose share of the window it
        counts in (:meth:`source`). Moves tau; raises what the store raised (the gate is
        tightened then)."""
        accepted = decision is not None and decision.accepted
        shadowed = decision is not None and decision.shadowed
        if accepted and not shadowed:
            disagrees = None  # a label the gate did not ask for would bias the estimate
        failed = agent_failed and not accepted and score is not None
        if failed:
            disagrees = True
        at = decision.at if decision is not None and decision.at else time.time()
        chance = decision.chance if accepted and decision is not None else 1.0
        observation = Observation(
            at, score, accepted, shadowed, disagrees, failed, chance, bound=bound, source=source
        )
        key = key or uuid.uuid4().hex
        if self.rolling is not None:
            self.rolling.observe(key, accepted, disagrees, chance)
        try:
            self.ledger.record(key, observation)
            with self._lock:
                self.seen += 1
        finally:
            self._refit()

    def _evidence(self) -> list[Observation]:
        """The window as it counts: settled, and no older than ``max_age_s``."""
        now = time.time()
        queries = settled(self.ledger.recent(), now, self.shadow_patience_s, self.ledger.alive)
        if self.max_age_s is not None:
            oldest = now - self.max_age_s
            queries = [q for q in queries if q.at >= oldest]
        room = self.window - len(queries)
        return (self.seeds[-room:] if room > 0 else []) + queries

    def _refit(self) -> None:
        recent = self._evidence()
        trouble = self.ledger.trouble() or self.label_flow.trouble()
        tau, estimate, bound = self.start_tau, None, None
        certified = tau
        acceptance = sum(q.accepted for q in recent) / len(recent) if recent else 0.0
        labelled = [q.disagrees for q in recent if q.score is not None and q.disagrees is not None]
        counts = {"window": len(recent), "labelled": len(labelled), "disagreeing": sum(labelled)}
        if self.rolling is not None or len(recent) >= self.warmup:
            estimates, bounds = self._bounds(recent)
            tau = (
                certified_tau(self.taus, estimates, bounds, self.max_risk,
                              self.tolerance * self.max_risk)
                if self.rolling is None
                else self.rolling.tau
            )  # fmt: skip
            certified = tau
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
            self.certified, self.acceptance, self.counts = certified, acceptance, counts
        if trouble != before:
            if trouble is None:
                log.info("online gate %r is no longer tightened: its labels flow", self.namespace)
            elif before is None:
                log.warning(
                    "online gate %r tightened to tau >= %s: %s",
                    self.namespace, self.outage_tau, trouble,
                )  # fmt: skip

    def risk_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(estimated risk, its upper bound) of the window at each candidate in ``taus``."""
        return self._bounds(self._evidence())

    def _bounds(self, queries: list[Observation]) -> tuple[np.ndarray, np.ndarray]:
        return window_risk(queries, self.taus, self.delta, len(self.shadow.levels))

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
            "pending": len(queries)
            - len(settled(queries, time.time(), self.shadow_patience_s, self.ledger.alive)),
            "labelled": sum(q.disagrees is not None for q in queries if q.score is not None),
            "shadowed": sum(q.accepted and q.disagrees is not None for q in queries),
            "agent_failures": sum(q.failed for q in queries),
            "max_risk": self.max_risk,
            "tolerance": self.tolerance,
            "shadow_rate": self.shadow_rate,
            "shadow_policy": repr(self.shadow),
            "acceptance": self.acceptance,
            "seeded": len(self.seeds),
            # how many callers (or open-server minutes) the window holds, and the most any
            # one may hold: a window short of its warm-up for want of sources says so here
            "sources": len({q.source for q in queries}),
            "per_source": self.cap,
            "shared": self.ledger.shared,
            "scope": self.scope,
            "skipped": dict(self.ledger.skipped),
            "trouble": self.trouble,
            "tightened": self.trouble is not None,
            "refused": self.refused,
            "shadow_runs": self.shadows.stats(),
            "label_flow": self.label_flow.stats(),
            "rolling_loss": None if self.rolling is None else self.rolling.average_loss(),
        }
