"""The SpecEyes graph's nodes: intake and the phases, each a small function of the state.

``intake`` checks the query and starts the run clean; ``judge``, ``speculate`` and ``gate``
run the phases of :mod:`speceyes_graph.phases` on the query; the routers name the edge each
state takes. The agent fallback (phase IV) is :mod:`speceyes_graph.graph.fallback`, depth-D
speculation :mod:`speceyes_graph.graph.tool_speculation`; :func:`~speceyes_graph.create_speceyes_graph`
wires them.

With ``speculation="parallel"`` the judge node starts the query's draft on the small model's
worker before it calls the large model, and ``speculate`` collects it: a speculative query
then takes about max(judge, draft) instead of judge + draft. When the judge asks for tools
the query goes on to the agent loop at once; its draft is cancelled if it is still queued
(it never reaches ``generate``) or discarded if it ran, and recorded (``draft["discarded"]``).
The agent loop never sees it, so answers, routes and scores are those of the sequential
funnel.

Each node that waits is a generator of :mod:`speceyes_graph.effects` requests, so it runs
under ``invoke`` and ``ainvoke`` alike. Failures are data: a node catches its own failure
and records it in ``error`` (or raises :class:`SpecEyesError` when the run asks for that).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Overwrite

from speceyes_tools.deadlines import DeadlineExceeded, deadline_scope, time_left

from .. import phases
from ..effects import Blocking, Collect, Steps
from ..gate.online_steps import OnlineSteps
from ..messages import bare_model
from ..query import read_query
from ..settings import RunSettings, resolve_settings, run_overrides
from ..state import Draft, Query, SpecEyesContext, SpecEyesState
from .options import GraphSetup
from .parallel_drafts import StartedDrafts

__all__ = [
    "NodeKit",
    "SpecEyesError",
    "after_gate",
    "after_intake",
    "after_judge",
    "gate_node",
    "intake_node",
    "judge_node",
    "speculate_node",
]

log = logging.getLogger(__name__)

# What intake writes first: no output of an earlier run on the same thread survives.
_CLEAN_RUN: dict[str, Any] = {
    "answer": None,
    "route": None,
    "judge_output": None,
    "draft": None,
    "tool_draft": None,
    "agent_messages": [],
    "agent_steps": [],
    "stop_reason": None,
    "error": None,
    "query": None,
    "pending_draft": None,
    "gate_key": None,
}


class SpecEyesError(RuntimeError):
    """A query failed and the run was asked to raise (``on_error="raise"``)."""


class NodeKit:
    """What the nodes of one graph share: its setup, the phases' models (internal: hidden
    from the messages stream, named in traces), how a query fails, how a model is called."""

    def __init__(self, setup: GraphSetup) -> None:
        self.setup = setup
        self.store = setup.store
        self.judge = phases.internal(setup.judge, "judge")
        self.speculator = phases.internal(setup.speculator, "speculator")
        tokens = setup.speculation
        self.judge_kwargs = (
            {"max_tokens": tokens.judge_max_tokens} if tokens.judge_max_tokens else {}
        )
        self.draft_kwargs = (
            {"max_tokens": tokens.draft_max_tokens} if tokens.draft_max_tokens else {}
        )
        # the models whose context the question must fit
        self.token_models = [
            m for m in (setup.judge, setup.speculator, setup.agent) if m is not None
        ]
        # What each model can do, looked up once: reading a trait through pydantic bindings
        # costs a hundred dict lookups (docs/throughput.md), and every model call asks.
        self._traits: dict[int, tuple[bool, bool]] = {}

    def traits(self, model: Any) -> tuple[bool, bool]:
        """(takes announcements, honours deadlines itself) of one of this graph's models."""
        found = self._traits.get(id(model))
        if found is None:
            bare = bare_model(model)
            found = (callable(getattr(bare, "announce", None)), phases.handles_deadlines(bare))
            self._traits[id(model)] = found
        return found

    def failed(
        self, state: Mapping[str, Any], phase: str, exc: BaseException, t0: float
    ) -> dict[str, Any]:
        message = f"{phase}: {type(exc).__name__}: {exc}"
        log.info("query failed in %s: %s", phase, exc)
        if (state.get("settings") or {}).get("on_error", self.setup.on_error) == "raise":
            raise SpecEyesError(message) from exc
        return {"error": message, "timings": {phase: time.perf_counter() - t0}}

    def call(self, state: Mapping[str, Any], model: Any, announced: bool = True) -> dict[str, Any]:
        """:func:`~speceyes_graph.phases.ask`'s keywords for a call of this query: its
        deadline, the model timeout, and ``announced`` when intake or the judge said it was
        coming (:meth:`announce`)."""
        takes_announcements, own_deadlines = self.traits(model)
        call: dict[str, Any] = {
            "store": self.store,
            "deadline": state.get("deadline"),
            "timeout": state["settings"]["model_timeout_s"],
            "inline": own_deadlines,
        }
        if announced and takes_announcements:
            call["announced"] = True
        return call

    def ask(
        self,
        state: Mapping[str, Any],
        model: Any,
        messages: Callable[[], list[BaseMessage]],
        what: str,
        announced: bool = True,
        **kwargs: Any,
    ) -> Steps:
        """One model call of this query (``reply = yield from kit.ask(...)``)."""
        return (
            yield from phases.ask(
                model, messages, what, **self.call(state, model, announced), **kwargs
            )
        )

    def draft_reply(self, state: Mapping[str, Any]) -> Steps:
        """Phase II for this query: the small model's reply."""
        setup = self.setup
        return (
            yield from phases.draft(
                self.speculator,
                state["query"],
                prompts=setup.prompts,
                resize=setup.speculation.resize,
                max_tokens=setup.speculation.draft_max_tokens,
                **self.call(state, setup.speculator),
            )
        )


# --- intake: a clean run, a checked query ---------------------------------------------------


def intake_node(kit: NodeKit, online: OnlineSteps | None) -> Callable[..., Steps]:
    """Reset every output, resolve the run's settings (context, capped by the limits), set
    the query's deadline, validate the query and decode its images once. Every judge and
    draft call is announced to its model's batch worker as soon as it is certain (here: the
    query's first calls, before its images are decoded; a batch forming meanwhile waits)."""
    setup = kit.setup
    calls = {
        "judge": (setup.judge, kit.judge_kwargs),
        "speculator": (setup.speculator, kit.draft_kwargs),
    }
    at_intake = {
        "judge": ("speceyes",),
        "speculator": ("small", "speceyes") if setup.parallel else ("small",),
    }

    def intake(
        state: SpecEyesState, runtime: Runtime[SpecEyesContext], config: RunnableConfig
    ) -> Steps:
        t0 = time.perf_counter()
        clean = {**_CLEAN_RUN, "timings": Overwrite({})}
        try:
            overrides = run_overrides(runtime.context, config)
            settings = resolve_settings(overrides, setup.defaults, setup.limits)
        except Exception as exc:
            return {**clean, **_overwrite_timings(kit.failed({}, "settings", exc, t0))}
        clean["settings"] = settings.as_dict()
        if online is not None:  # only runs under the deployment's settings teach it
            deployment = resolve_settings(None, setup.defaults, setup.limits)
            learns = settings.mode == "speceyes" and settings.same_run_as(deployment)
            clean["gate_key"] = online.key(config, learns)
        clean["deadline"] = deadline = time.time() + settings.query_timeout_s
        announced: list[tuple[Any, dict[str, Any]]] = []
        try:
            if settings.mode not in setup.available:
                raise ValueError(
                    f"mode {settings.mode!r} needs models this graph was built without "
                    f"(available modes: {sorted(setup.available)})"
                )

            def check_and_decode() -> Query:  # reads files and URLs: off the loop
                with deadline_scope(deadline):
                    query = read_query(state, kit.store, setup.limits, kit.token_models)
                    for what, modes in at_intake.items():
                        model, kwargs = calls[what]
                        if settings.mode in modes and kit.traits(model)[0]:
                            phases.announce(model, **kwargs)
                            announced.append((model, kwargs))
                    for ref in query["images"]:
                        kit.store.get(ref)  # decode now: a broken image fails here
                return query

            images = state.get("images") if isinstance(state, dict) else None
            query = yield Blocking(
                check_and_decode,
                # images seen before (another question on them): only lookups, in place
                ready=lambda: isinstance(images, list) and kit.store.has_decoded(images),
            )
        except Exception as exc:
            for model, kwargs in announced:  # those calls will not come
                phases.announce(model, -1, **kwargs)
            return {**clean, **_overwrite_timings(kit.failed(clean, "input", exc, t0))}
        return {
            **clean,
            "query": query,
            "route": "agent-only" if settings.mode == "agent" else None,
            "timings": Overwrite({"intake": time.perf_counter() - t0}),
        }

    return intake


def after_intake(state: SpecEyesState) -> str:
    return "invalid" if state.get("error") else state["settings"]["mode"]


# --- phase I ----------------------------------------------------------------------------------


def judge_node(
    kit: NodeKit, drafts: StartedDrafts, online: OnlineSteps | None
) -> Callable[..., Steps]:
    setup = kit.setup

    def judge(
        state: SpecEyesState, runtime: Runtime[SpecEyesContext], config: RunnableConfig
    ) -> Steps:
        t0 = time.perf_counter()
        ticket = (yield from drafts.start(kit.draft_reply(state))) if setup.parallel else None
        try:
            judgement = yield from phases.judge(
                kit.judge,
                state["query"],
                prompts=setup.prompts,
                resize=setup.judge_resize,
                max_tokens=setup.speculation.judge_max_tokens,
                **kit.call(state, setup.judge),
            )
        except Exception as exc:
            drafts.abandon(ticket)
            return kit.failed(state, "judge", exc, t0)
        update: dict[str, Any] = {
            "judge_output": judgement.output,
            "route": "judged-agentic" if judgement.tools_needed else None,
            "timings": {"judge": time.perf_counter() - t0},
        }
        if ticket is not None and judgement.tools_needed:
            update["draft"] = {"text": "", "accepted": False, "discarded": True}
            update["draft"]["note"] = drafts.abandon(ticket)
        elif ticket is not None:
            update["pending_draft"] = ticket
        elif not judgement.tools_needed and kit.traits(setup.speculator)[0]:
            phases.announce(setup.speculator, **kit.draft_kwargs)  # the draft comes next
        if online is not None and judgement.tools_needed and state.get("gate_key"):
            online.judged_agentic(online.run_key(config, state["gate_key"]), config)
        return update

    return judge


def after_judge(state: SpecEyesState) -> str:
    if state.get("error"):
        return "failed"
    if state.get("route") != "judged-agentic":
        return "no"
    return "yes, speculate with tools" if state["settings"].get("speculation_depth") else "yes"


# --- phase II ---------------------------------------------------------------------------------


def speculate_node(
    kit: NodeKit, drafts: StartedDrafts, online: OnlineSteps | None = None
) -> Callable[..., Steps]:
    """The draft (drafted beside the judge, or now), scored by the gate at this run's tau;
    an online gate's binds it to the run (only this draft can earn this run a label)."""
    gate = kit.setup.gate

    def speculate(state: SpecEyesState, config: RunnableConfig) -> Steps:
        t0 = time.perf_counter()
        settings = state["settings"]
        try:
            started = drafts.take(state.get("pending_draft"))
            if started is not None:
                with deadline_scope(state.get("deadline")):
                    reply = yield Collect(started, timeout=time_left(settings["model_timeout_s"]))
            else:
                reply = yield from kit.draft_reply(state)
        except Exception as exc:
            if type(exc) is TimeoutError:  # Collect's own wait
                exc = DeadlineExceeded("the draft started beside the judge did not finish in time")
            if settings["mode"] == "small":
                return kit.failed(state, "speculator", exc, t0)
            failed: Draft = {
                "text": "",
                "accepted": False,
                "error": f"speculator: {type(exc).__name__}: {exc}",
            }
            return {"draft": failed, "timings": {"speculate": time.perf_counter() - t0}}
        draft = phases.gate(reply, RunSettings(**settings).gate(gate))
        if online is not None and state.get("gate_key"):
            key = online.run_key(config, state["gate_key"])
            online.drafted(key, draft, state["query"], config)
        return {"draft": draft, "timings": {"speculate": time.perf_counter() - t0}}

    return speculate


# --- phase III --------------------------------------------------------------------------------


def gate_node(online: OnlineSteps | None) -> Callable[..., Steps]:
    """Route on the draft's verdict (an online gate decides at its own tau first)."""

    def gate(
        state: SpecEyesState, runtime: Runtime[SpecEyesContext], config: RunnableConfig
    ) -> Steps:
        draft = state.get("draft") or {}
        if state["settings"]["mode"] == "small":
            return {"answer": draft.get("text") or None, "route": "draft-only"}
        update: dict[str, Any] = {}
        if online is not None and state.get("gate_key"):
            key = online.run_key(config, state["gate_key"])
            draft = update["draft"] = yield from online.decide(key, state, draft, runtime.store)
        if draft.get("accepted"):
            return {**update, "answer": draft.get("text"), "route": "speculative"}
        return {**update, "route": "rejected-agentic"}

    return gate


def after_gate(state: SpecEyesState) -> str:
    if state.get("route") == "rejected-agentic":
        return "reject"
    return "failed" if state.get("error") else "accept"


def _overwrite_timings(update: dict[str, Any]) -> dict[str, Any]:
    return {**update, "timings": Overwrite(update.get("timings") or {})}
