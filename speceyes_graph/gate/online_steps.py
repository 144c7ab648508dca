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

**A label is an agent's verdict, nothing else.** Only runs under the deployment's own
settings are gated online (:meth:`OnlineSteps.key`). The agent's run ends one of three ways
(:data:`Verdict`): it *answered* (the label: agrees or not), the agent was *unavailable* (it
could not be reached or answered with a server error: the draft counts as disagreeing, so
an agent that is down tightens the gate), or it *stopped* without a verdict (its step
limit, the query's deadline, a failure of the query's own; a run interrupted or cancelled
before it never gets here): no label, and the draft's pending decision never counts. A
query the judge sent to the tools joins the window only once its agent answered, so traffic
that never reaches an agent cannot dilute the risk. Each entry names its *source* (the
caller's identity, or an open server's burst of traffic), whose share of the window the
ledger bounds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from cachetools import FIFOCache
from langgraph.store.base import BaseStore

from ..answers import answers_agree
from ..effects import Blocking, Steps
from ..state import Draft
from .online import GateDecision, OnlineGate

__all__ = ["AgentStopped", "OpenDecisions", "OnlineSteps", "Verdict"]

Verdict = Literal["answered", "unavailable", "stopped"]
"""How an agent's run on a query ended, as the online gate reads it (the module docstring)."""


class AgentStopped(RuntimeError):
    """A shadow run stopped without a verdict (its step limit, its deadline): no label, and
    no sign that labels stopped flowing."""


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
    source: str = ""  # whose share of the window its entry counts in
    judged_agentic: bool = False  # no draft: the judge sent it to the tools

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
    def key(config: Mapping[str, Any], learns: bool) -> str | None:
        """The query's key at intake, or None when the online gate does not gate it (a
        baseline mode, or a run whose settings are not the deployment's: its labels would
        say what another tau, K, step limit or deadline does): :meth:`run_key`, with a fresh
        id as the nonce of a run no server gave an id."""
        return OnlineSteps.run_key(config, uuid.uuid4().hex) if learns else None

    def source(self, config: Mapping[str, Any]) -> str:
        """Whose share of the gate's window this run's entry counts in
        (:meth:`~speceyes_graph.gate.online.OnlineGate.source`): the caller's identity,
        which LangGraph's servers and Aegra set in ``configurable.langgraph_auth_user``
        whatever the client sent; none in a run no server gave an id."""
        configurable = config.get("configurable") or {}
        user = configurable.get("langgraph_auth_user")
        identity = (
            user.get("identity") if isinstance(user, Mapping) else getattr(user, "identity", None)
        )
        return self.gate.source(
            identity if isinstance(identity, str) else None, bool(configurable.get("run_id"))
        )

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
        source: str = "",
    ) -> None:
        try:
            self.gate.observe(
                decision, score, label, key=key, agent_failed=agent_failed, bound=bound,
                source=source,
            )  # fmt: skip
        except Exception as exc:  # the store is down: the answer stands, the label is lost
            log.warning("the online gate could not record a label: %s: %s", type(exc).__name__, exc)

    def judged_agentic(self, key: str | None, config: Mapping[str, Any]) -> None:
        """A query the judge sent to the tools: it joins the window, without a draft, once
        its agent answered (:meth:`after_agent`)."""
        if key is not None:
            self.open.put(
                key, _Open(None, None, None, source=self.source(config), judged_agentic=True)
            )

    def drafted(
        self,
        key: str | None,
        draft: Draft,
        query: Mapping[str, Any] | None,
        config: Mapping[str, Any],
    ) -> None:
        """Bind the draft this run's speculate node made (its score, text and the query's
        options) to the run: the gate decides only on it, and labels only it."""
        if key is not None:
            options = (query or {}).get("options")
            source = self.source(config)
            self.open.put(
                key, _Open(_gated_score(draft), draft.get("text"), options, source=source)
            )

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
            or bound.judged_agentic
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
        source = bound.source
        if decision.accepted:
            self.open.pop(key)  # its label, if any, comes from the shadow run alone
            yield Blocking(partial(self._record, decision, score, None, key, source=source))
        elif score is not None:  # its label comes with the agent: the same run, here or
            # redelivered to another worker, which finds the decision in the ledger
            pending = partial(self._record, decision, score, None, key, source=source)
            yield Blocking(partial(pending, bound=bound.digest()))
        if decision.shadowed or decision.probe:
            work = self._shadow(key, state, gated, decision, source)
            yield Blocking(gate.shadows.submit, work)
        return gated

    def _shadow(
        self, key: str, state: Mapping[str, Any], gated: Draft, decision: GateDecision, source: str
    ) -> tuple[Callable[[], bool], Callable[[bool | None, bool], None]]:
        """A shadow run's work and what its label does: the label of an accepted draft, or
        for a probe (a rejected draft shadowed while shadows fail, to see whether they work
        again) only whether a label came. A shadow that stopped without a verdict
        (:class:`AgentStopped`) gives no label and says nothing about the label flow."""
        options = (state.get("query") or {}).get("options")
        score = _gated_score(gated)
        stopped = threading.Event()

        def verify() -> bool:
            try:
                answer = self.shadow(state, gated)
            except AgentStopped:
                stopped.set()
                raise
            return not answers_agree(gated.get("text"), answer, options)

        def done(label: bool | None, dropped: bool) -> None:
            if not stopped.is_set():
                self.gate.shadow_outcome(None if dropped else label is not None)
            if decision.probe:
                return  # the rejected draft's label comes with the user's agent run
            if label is None:  # failed or dropped: an accepted draft without a label
                self._record(replace(decision, shadowed=False), score, None, key, source=source)
            else:
                self._record(decision, score, label, key, source=source)

        return verify, done

    def after_agent(
        self,
        key: str | None,
        answer: str | None,
        verdict: Verdict,
        draft: Mapping[str, Any] | None = None,
        options: Any = None,
        store: BaseStore | None = None,
    ) -> Steps:
        """What the agent's run says of this run's query, once: a rejected draft's label
        (whether it disagrees with the agent's ``answer``; counted as disagreeing when the
        agent was unavailable), or a query the judge sent to the tools joining the window;
        nothing when the agent stopped without a verdict (the module docstring).

        The same run redelivered to another worker (its first died after the gate) finds
        its decision in the ledger instead, pending, under the run's key; it labels it only
        if the state's ``draft`` and ``options`` are the ones decided on (their digest)."""
        if key is None or verdict == "stopped":
            if key is not None:
                self.open.pop(key)
            return
        failed = verdict == "unavailable"
        bound = self.open.pop(key)
        if bound is None:  # not decided here: redelivered, or not this run's
            if _gated_score(draft or {}) is None:
                return  # no draft met the gate (the judge asked for tools): nothing to read
            self.gate.bind(store)
            yield Blocking(self._redelivered, (key, answer, failed, draft or {}, options))
            return
        if bound.judged_agentic:
            if not failed:
                self.gate.bind(store)
                yield Blocking(partial(self._record, None, None, None, key, source=bound.source))
            return
        if bound.decision is None or bound.decision.accepted:
            return
        label = True if failed else not answers_agree(bound.text, answer, bound.options)
        yield Blocking(
            partial(
                self._record, bound.decision, bound.score, label, key, failed, source=bound.source
            )
        )

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
        self._record(decision, decided.score, label, key, failed, source=decided.source)


def _gated_score(draft: Mapping[str, Any]) -> float | None:
    """The score a draft meets the gate with: none for an empty or failed draft, which the
    gate rejects at any tau (and the estimate counts as a query without a draft)."""
    return draft.get("score") if draft.get("text") and not draft.get("error") else None
