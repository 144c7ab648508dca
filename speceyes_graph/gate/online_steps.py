"""The online gate's part of a graph run: which key a query has in the gate's ledger, the
decision at the gate, and the labels that come back (from the agent's answer after a
rejection, or from a shadow run after an acceptance).

:mod:`speceyes_graph.graph.nodes` and :mod:`speceyes_graph.graph.fallback` call these from the graph's
nodes when it was built with ``gate=OnlineGate(...)``, and
:class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware` from an agent's. Each is a generator of :mod:`~speceyes_graph.effects` requests, so
the store's I/O runs in a worker thread under ``ainvoke``/the server and in place under
``invoke``. A label is never allowed to fail its query: a failed write is logged and the
query's answer stands (the gate has one observation fewer).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from langgraph.store.base import BaseStore

from ..answers import answers_agree
from ..effects import Blocking, Steps
from ..state import Draft
from .online import GateDecision, OnlineGate

__all__ = ["OnlineSteps"]

log = logging.getLogger(__name__)


class OnlineSteps:
    """An online gate as a graph's nodes use it.

    ``shadow(state, draft)`` runs the agent loop on a query to label its accepted draft
    (blocking, in a shadow thread: the user's answer has already returned) and returns the
    agent's answer.
    """

    def __init__(self, gate: OnlineGate, shadow: Callable[[Mapping[str, Any], Draft], str | None]):
        self.gate, self.shadow = gate, shadow

    @staticmethod
    def key(config: Mapping[str, Any], overrides: Mapping[str, Any], mode: str) -> str | None:
        """The query's key in the ledger, or None when the online gate does not gate it (a
        baseline mode, or a run whose context sets its own ``tau``). A served run's id and
        the graph's place in its parent (stable when an engine redelivers the run), else a
        fresh id."""
        if mode != "speceyes" or "tau" in overrides:
            return None
        configurable = config.get("configurable") or {}
        run_id = configurable.get("run_id") or (config.get("metadata") or {}).get("run_id")
        if not run_id:
            return uuid.uuid4().hex
        return f"{run_id}|{configurable.get('checkpoint_ns', '')}"

    def _record(
        self,
        decision: GateDecision | None,
        score: float | None,
        label: bool | None,
        key: str,
        agent_failed: bool = False,
    ) -> None:
        try:
            self.gate.observe(decision, score, label, key=key, agent_failed=agent_failed)
        except Exception as exc:  # the store is down: the answer stands, the label is lost
            log.warning("the online gate could not record a label: %s: %s", type(exc).__name__, exc)

    def no_draft(self, key: str | None, store: BaseStore | None) -> Steps:
        """A query the judge sent to the tools: in the window, with no draft."""
        if key is None:
            return
        self.gate.bind(store)
        yield Blocking(self._record, (None, None, None, key))

    def decide(self, state: Mapping[str, Any], draft: Draft, store: BaseStore | None) -> Steps:
        """Gate a tool-free draft at the online tau; returns the draft with the tau it met
        and whether it was shadowed. An accepted draft is observed now (a shadowed one's
        label replaces the entry when its shadow run ends); a rejected one's label comes
        with the agent's answer (:meth:`rejected`)."""
        key = state.get("gate_key")
        if key is None:
            return draft
        gate = self.gate
        gate.bind(store)
        if gate.stale():
            yield Blocking(gate.refresh)  # never raises: a failed read tightens the gate
        score = _gated_score(draft)
        decision = gate.decide(score)
        gated: Draft = {
            **draft,
            "accepted": decision.accepted,
            "tau": decision.tau,
            "shadowed": decision.shadowed,
            "gated_at": decision.at,
            "gate_risk": decision.risk,
            "gate_risk_bound": decision.risk_bound,
        }
        if decision.accepted:
            yield Blocking(self._record, (decision, score, None, key))
        if decision.shadowed:
            query = state["query"]

            def verify() -> bool:
                answer = self.shadow(state, gated)
                return not answers_agree(gated.get("text"), answer, query.get("options"))

            def done(label: bool | None) -> None:
                if label is None:  # failed or dropped: an accepted draft without a label
                    self._record(replace(decision, shadowed=False), score, None, key)
                else:
                    self._record(decision, score, label, key)

            yield Blocking(gate.shadows.submit, (verify, done))  # a dropped one records at once
        return gated

    def rejected(self, state: Mapping[str, Any], answer: str | None, failed: bool) -> Steps:
        """The label of a draft the gate rejected: whether it disagrees with the agent's
        answer. An agent that failed gives no agreement: the draft counts as disagreeing
        (an outage of the agent must not teach the gate that low-scored drafts are right)."""
        key, draft = state.get("gate_key"), state.get("draft") or {}
        if key is None or "tau" not in draft:
            return
        decision = GateDecision(False, False, draft["tau"], draft.get("gated_at") or time.time())
        score = _gated_score(draft)
        options = (state.get("query") or {}).get("options")
        label = True if failed else not answers_agree(draft.get("text"), answer, options)
        yield Blocking(self._record, (decision, score, label, key, failed))


def _gated_score(draft: Mapping[str, Any]) -> float | None:
    """The score a draft meets the gate with: none for an empty or failed draft, which the
    gate rejects at any tau (and the estimate counts as a query without a draft)."""
    return draft.get("score") if draft.get("text") and not draft.get("error") else None
