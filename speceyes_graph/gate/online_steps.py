"""The online gate's part of a graph run: which key a query has in the gate's ledger, the
decision at the gate, and the labels that come back (from the agent's answer after a
rejection, or from a shadow run after an acceptance).

:mod:`speceyes_graph.graph.nodes` and :mod:`speceyes_graph.graph.fallback` call these from the graph's
nodes when it was built with ``gate=OnlineGate(...)``, and
:class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware` from an agent's. Each is a generator of :mod:`~speceyes_graph.effects` requests, so
the store's I/O runs in a worker thread under ``ainvoke``/the server and in place under
``invoke``. A label is never allowed to fail its query: a failed write is logged and the
query's answer stands (the gate has one observation fewer).

**A label counts only for a decision the gate made, once.** A server lets any client write
a thread's state (``update_state`` as any node, ``Command(update=...)``, a run forked from
an old checkpoint, the input itself), and see every thread's. So nothing the gate counts is
read from state: the draft the gate decides on is the one this process's ``speculate`` made
in the same run (bound to the run with :meth:`OnlineSteps.drafted`), the decision and the
draft's text and options stay in this process (:class:`OpenDecisions`), and the label is
recorded once, by the same run, under the run's key: the server's run id from the run's
own config (LangGraph's servers and Aegra set it; a client cannot), not the state's
``gate_key``. A run handed a draft it did not make still answers (the agent runs); it
earns no label. A rejected draft's decision is written to the ledger at once, pending and
bound to a digest of the draft: the same run redelivered to another worker after its first
died finds it there and labels it, once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cachetools import FIFOCache
from langgraph.store.base import BaseStore

from ..answers import answers_agree
from ..effects import Blocking, Steps
from ..state import Draft
from .online import GateDecision, OnlineGate

__all__ = ["OpenDecisions", "OnlineSteps"]

log = logging.getLogger(__name__)

UNBOUND = (
    "not gated online: this run did not make this draft (state written from outside, or a "
    "resumed, forked or redelivered run); the agent answers and no label is taken"
)


@dataclass
class _Open:
    """A run's draft as its own speculate node made it, and later the gate's decision."""

    score: float | None
    text: str | None
    options: Any
    decision: GateDecision | None = None

    def digest(self) -> str:
        """What a pending decision in the ledger is bound to: this draft and its options."""
        body = json.dumps([self.score, self.text, self.options], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:32]


class OpenDecisions:
    """The drafts and decisions of runs still under way in this process, by run key:
    bounded (a run that never comes back for its entry, a failed or abandoned one, must
    not grow a worker's memory), each taken once."""

    def __init__(self, most: int = 10_000) -> None:
        self._items: FIFOCache[str, _Open] = FIFOCache(most)
        self._lock = threading.Lock()

    def put(self, key: str, entry: _Open) -> None:
        with self._lock:
            self._items[key] = entry

    def get(self, key: str) -> _Open | None:
        with self._lock:
            return self._items.get(key)

    def pop(self, key: str) -> _Open | None:
        with self._lock:
            return self._items.pop(key, None)


class OnlineSteps:
    """An online gate as a graph's nodes use it.

    ``shadow(state, draft)`` runs the agent loop on a query to label its accepted draft
    (blocking, in a shadow thread: the user's answer has already returned) and returns the
    agent's answer.
    """

    def __init__(self, gate: OnlineGate, shadow: Callable[[Mapping[str, Any], Draft], str | None]):
        self.gate, self.shadow = gate, shadow
        self.open = OpenDecisions()

    @staticmethod
    def key(config: Mapping[str, Any], overrides: Mapping[str, Any], mode: str) -> str | None:
        """The query's key at intake, or None when the online gate does not gate it (a
        baseline mode, or a run whose context sets its own ``tau``): :meth:`run_key`, with a
        fresh id as the nonce of a run no server gave an id."""
        if mode != "speceyes" or "tau" in overrides:
            return None
        return OnlineSteps.run_key(config, uuid.uuid4().hex)

    @staticmethod
    def run_key(config: Mapping[str, Any], nonce: str | None) -> str | None:
        """The run's key in the ledger, the same in each node of the run: the server's run
        id (``configurable.run_id``, which LangGraph's servers and Aegra set whatever the
        client sent; stable when an engine redelivers the run) and the graph's place in its
        parent (``checkpoint_ns`` without the node's own task). A run without one (a graph
        invoked in process) is known by ``nonce``, the id its intake drew."""
        configurable = config.get("configurable") or {}
        run_id = configurable.get("run_id")
        if not run_id:
            return nonce
        parent = str(configurable.get("checkpoint_ns") or "").rpartition("|")[0]
        return f"{run_id}|{parent}"

    def _record(
        self,
        decision: GateDecision | None,
        score: float | None,
        label: bool | None,
        key: str,
        agent_failed: bool = False,
        bound: str = "",
    ) -> None:
        try:
            self.gate.observe(
                decision, score, label, key=key, agent_failed=agent_failed, bound=bound
            )
        except Exception as exc:  # the store is down: the answer stands, the label is lost
            log.warning("the online gate could not record a label: %s: %s", type(exc).__name__, exc)

    def no_draft(self, key: str | None, store: BaseStore | None) -> Steps:
        """A query the judge sent to the tools: in the window, with no draft."""
        if key is None:
            return
        self.gate.bind(store)
        yield Blocking(self._record, (None, None, None, key))

    def drafted(self, key: str | None, draft: Draft, query: Mapping[str, Any] | None) -> None:
        """Bind the draft this run's speculate node made (its score, text and the query's
        options) to the run: the gate decides only on it, and labels only it."""
        if key is not None:
            options = (query or {}).get("options")
            self.open.put(key, _Open(_gated_score(draft), draft.get("text"), options))

    def decide(
        self, key: str | None, state: Mapping[str, Any], draft: Draft, store: BaseStore | None
    ) -> Steps:
        """Gate a tool-free draft at the online tau; returns the draft with the tau it met,
        whether it was shadowed and whether the gate is shared. An accepted draft is
        observed now (a shadowed one's label replaces the entry when its shadow run ends); a
        rejected one's label comes with the agent's answer (:meth:`rejected`). A draft this
        run did not make is rejected without a decision: the agent answers, no label."""
        gate = self.gate
        bound = self.open.get(key) if key is not None else None
        if (
            key is None
            or bound is None
            or bound.decision is not None
            or bound.score != _gated_score(draft)
            or bound.text != draft.get("text")
        ):
            return {**draft, "accepted": False, "note": UNBOUND, "gate_scope": gate.scope}
        gate.bind(store)
        if gate.stale():
            yield Blocking(gate.refresh)  # never raises: a failed read tightens the gate
        score = bound.score
        decision = bound.decision = gate.decide(score)
        gated: Draft = {
            **draft,
            "accepted": decision.accepted,
            "tau": decision.tau,
            "shadowed": decision.shadowed,
            "gated_at": decision.at,
            "gate_risk": decision.risk,
            "gate_risk_bound": decision.risk_bound,
            "gate_scope": gate.scope,
            "gate_counts": dict(gate.counts),
        }
        if decision.accepted:
            self.open.pop(key)  # its label, if any, comes from the shadow run alone
            yield Blocking(self._record, (decision, score, None, key))
        elif score is not None:  # its label comes with the agent: the same run, here or
            # redelivered to another worker, which finds the decision in the ledger
            yield Blocking(self._record, (decision, score, None, key, False, bound.digest()))
        if decision.shadowed or decision.probe:
            yield Blocking(gate.shadows.submit, self._shadow(key, state, gated, decision))
        return gated

    def _shadow(
        self, key: str, state: Mapping[str, Any], gated: Draft, decision: GateDecision
    ) -> tuple[Callable[[], bool], Callable[[bool | None, bool], None]]:
        """A shadow run's work and what its label does: the label of an accepted draft, or
        for a probe (a rejected draft shadowed while shadows fail, to see whether they work
        again) only whether a label came."""
        options = (state.get("query") or {}).get("options")
        score = _gated_score(gated)

        def verify() -> bool:
            answer = self.shadow(state, gated)
            return not answers_agree(gated.get("text"), answer, options)

        def done(label: bool | None, dropped: bool) -> None:
            self.gate.shadow_outcome(None if dropped else label is not None)
            if decision.probe:
                return  # the rejected draft's label comes with the user's agent run
            if label is None:  # failed or dropped: an accepted draft without a label
                self._record(replace(decision, shadowed=False), score, None, key)
            else:
                self._record(decision, score, label, key)

        return verify, done

    def rejected(
        self,
        key: str | None,
        answer: str | None,
        failed: bool,
        draft: Mapping[str, Any] | None = None,
        options: Any = None,
        store: BaseStore | None = None,
    ) -> Steps:
        """The label of a draft the gate rejected in this run: whether it disagrees with
        the agent's answer. An agent that failed gives no agreement: the draft counts as
        disagreeing (an outage of the agent must not teach the gate that low-scored drafts
        are right). Once: the run's decision is taken with its label.

        The same run redelivered to another worker (its first died after the gate) finds
        its decision in the ledger instead, pending, under the run's key; it labels it only
        if the state's ``draft`` and ``options`` are the ones decided on (their digest)."""
        if key is None:
            return
        bound = self.open.pop(key)
        if bound is None:  # not decided here: redelivered, or not this run's
            if _gated_score(draft or {}) is None:
                return  # no draft met the gate (the judge asked for tools): nothing to read
            self.gate.bind(store)
            yield Blocking(self._redelivered, (key, answer, failed, draft or {}, options))
            return
        if bound.decision is None or bound.decision.accepted:
            return
        label = True if failed else not answers_agree(bound.text, answer, bound.options)
        yield Blocking(self._record, (bound.decision, bound.score, label, key, failed))

    def _redelivered(
        self, key: str, answer: str | None, failed: bool, draft: Mapping[str, Any], options: Any
    ) -> None:
        try:
            decided = self.gate.ledger.get(key)
        except Exception as exc:  # the store is down: the answer stands, the label is lost
            log.warning(
                "the online gate could not read a decision: %s: %s", type(exc).__name__, exc
            )
            return
        here = _Open(_gated_score(draft), draft.get("text"), options)
        if (
            decided is None
            or decided.accepted
            or decided.disagrees is not None  # labelled already: a label is final
            or decided.score is None
            or not decided.bound
            or decided.bound != here.digest()
        ):
            return
        decision = GateDecision(False, False, self.gate.start_tau, decided.at)
        label = True if failed else not answers_agree(here.text, answer, options)
        self._record(decision, decided.score, label, key, failed)


def _gated_score(draft: Mapping[str, Any]) -> float | None:
    """The score a draft meets the gate with: none for an empty or failed draft, which the
    gate rejects at any tau (and the estimate counts as a query without a draft)."""
    return draft.get("score") if draft.get("text") and not draft.get("error") else None
