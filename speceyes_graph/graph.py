"""The SpecEyes workflow as a LangGraph state graph.

``intake -> judge -> speculate -> gate -> (END | agent_loop)``: ``intake`` checks the
query and starts the run clean; the large model judges whether tools are needed;
tool-free queries get a draft from the small model; the draft is kept when its answer
separability clears tau; everything else runs the agent loop. With ``speculation_depth``
D > 0 a query the judge sends to the tools first runs the small model's own tool loop
(``speculate_tools``, at most D tool steps; :mod:`speceyes_graph.tool_speculation`), and
reaches the agent loop only when that answer fails its gate.

With ``speculation="parallel"`` the judge node starts the query's draft on the small
model's worker before it calls the large model, and ``speculate`` collects it: a speculative
query then takes about max(judge, draft) instead of judge + draft. When the judge asks for
tools the query goes on to the agent loop at once; its draft is cancelled if it is still
queued (it never reaches ``generate``) or discarded if it ran, and recorded
(``draft["discarded"]``). The agent loop never sees it, so answers, routes and scores are
those of the sequential funnel (``speculation="after_judge"``, the paper's).

Every node has a synchronous and an asynchronous implementation from one body
(:mod:`speceyes_graph.effects`): under ``ainvoke``/``abatch``/``astream`` and in the LangGraph
server, model calls are awaited (``ainvoke``), parallel drafts are tasks and image work runs
in worker threads, so a query in flight holds no thread; ``invoke``/``batch`` give the same
results.

Failures are data: every node catches its own failures and records them in ``error``, so
one broken image, hung model or malformed reply fails that query only (or, with
``on_error="raise"``, fails that run, as a served graph wants). Every model call and the
query as a whole have deadlines. Model calls are tagged ``nostream``: with
``stream_mode="messages"`` a caller sees answers, not the judge's "yes" or the draft.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.constants import TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Overwrite

from speceyes_tools.deadlines import DeadlineExceeded, check_deadline, deadline_scope, time_left
from speceyes_tools.images import ImageStore, ResizeSpec, default_store, store_scope

from .agent import (
    DEFAULT_MAX_STEPS,
    THYME_MAX_STEPS,
    AgentLoopInput,
    LoopOptions,
    agent_system_prompt,
    create_agent_loop,
    emit_event,
    first_user_message,
    recursion_limit,
)
from .effects import Blocking, Collect, ModelCall, Steps, Subgraph, node, router
from .messages import Protocol, bare_model, for_model, user_message
from .online_gate import OnlineGate
from .online_steps import OnlineSteps
from .parallel_drafts import StartedDrafts
from .prompts import Prompts
from .protocol import message_text, parse_judge
from .query import read_query
from .separability import GateConfig
from .settings import Limits, OnError, RunSettings, resolve_settings, run_overrides
from .specreason import run_specreason
from .state import (
    Draft,
    Mode,
    PixelFreeGraph,
    Query,
    RunInput,
    SpecEyesContext,
    SpecEyesInput,
    SpecEyesOutput,
    SpecEyesState,
    pixel_free,
    pixel_free_input,
)
from .tool_speculation import after_tool_gate, speculate_tools_node
from .toolsets import Toolset, build_tools, load_toolset

__all__ = [
    "SpecEyesError",
    "Speculation",
    "create_speceyes_graph",
    "parse_judge",
    "score_draft",
]

log = logging.getLogger(__name__)
Speculation = Literal["parallel", "after_judge"]

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
_AUTO_PROTOCOL: dict[tuple[str, ...], Protocol] = {
    ("image_zoom_in_tool",): "deepeyes",
    ("python_sandbox",): "thyme",
}
THYME_TAU = 0.95  # the published threshold of the Thyme runs
_FIRST_NODE = {
    "agent": "agent_loop",
    "small": "speculate",
    "speceyes": "judge",
    "specreason": "specreason",
}  # by mode


class SpecEyesError(RuntimeError):
    """A query failed and the run was asked to raise (``on_error="raise"``)."""


def create_speceyes_graph(
    *,
    judge: BaseChatModel | None = None,
    speculator: BaseChatModel | None = None,
    agent: BaseChatModel | None = None,
    tools: str | Path | Toolset | Sequence[BaseTool] | None = "deepeyes",
    mode: Mode = "speceyes",
    speculation: Speculation = "after_judge",
    gate: GateConfig | OnlineGate | str | Path | None = None,
    speculator_as_judge: bool = False,
    max_agent_steps: int | None = None,
    judge_max_tokens: int | None = 10,
    draft_max_tokens: int | None = 20,
    protocol: Protocol | Literal["auto"] = "auto",
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    speculator_resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
    limits: Limits | None = None,
    on_error: OnError = "record",
    loop: LoopOptions | None = None,
    speculation_depth: int = 0,
    speculator_tools: str | Path | Toolset | Sequence[BaseTool] | None = None,
    speculator_prompts: Prompts | None = None,
    speculator_step_tokens: int | None = None,
) -> StateGraph[SpecEyesState, SpecEyesContext, SpecEyesInput, SpecEyesOutput]:
    """Build the (uncompiled) SpecEyes graph; call ``.compile()`` with your checkpointer.

    Args:
        judge: the large model for phase I; defaults to ``agent`` (the paper's setup).
        speculator: the small model; its replies must carry OpenAI-format top-K log-probs in
            ``response_metadata["logprobs"]`` (``ChatOpenAI(logprobs=True, top_logprobs=K)``
            or ``ChatTransformersVLM(top_logprobs=K)``).
        agent: the large tool-calling model for the fallback loop.
        tools: a built-in toolset name (``deepeyes``, ``vision``), a TOML/YAML file, a
            :class:`Toolset`, or a list of LangChain tools.
        mode: the default mode: ``speceyes``; ``agent`` (baseline, every query to the loop);
            ``small`` (draft only, never falls back; the gate score is still recorded). A run
            may pick another mode (context ``mode``) if the graph has its models.
        speculation: ``after_judge`` (the paper's funnel: draft only for queries judged
            tool-free) or ``parallel`` (draft while the judge runs; see the module docstring).
        gate: threshold, K, aggregation (defaults: tau 0.98, K 64, ``min``), or the path of
            a gate file from ``speceyes calibrate``; per run: context ``tau``, ``k``,
            ``aggregation``. Or an :class:`~speceyes_graph.online_gate.OnlineGate`: tau moves
            with the labels production gives so the risk stays at its target, and a share of
            accepted drafts is shadow-verified by the agent off the user's path; each draft
            records the ``tau`` it met and whether it was ``shadowed`` (a run whose context
            sets ``tau`` is gated at that tau instead, and not observed).
        speculator_as_judge: use the small model as the judge (the paper's ablation).
        max_agent_steps: model turns of the agent loop (per run: ``max_agent_steps``, up to
            ``limits.max_agent_steps``); default 6, or Thyme's published 5.
        judge_max_tokens: generation length of phase I (the published 10), passed to the
            model as ``max_tokens``; None leaves the model's own setting.
        draft_max_tokens: the same for phase II (the published 20).
        protocol: ``deepeyes`` (tool calls as text), ``thyme`` (the model writes Python that
            runs in the OS sandbox, ``tools="thyme"``), ``native`` (structured tool calls), or
            ``auto``: ``deepeyes`` when the toolset is exactly ``image_zoom_in_tool``,
            ``thyme`` when it is exactly ``python_sandbox``. Thyme runs default to the
            published Thyme prompts (``Prompts.thyme()``) and tau 0.95.
        resize: how the large model's processor resizes images (the frame of its boxes);
            by default taken from the agent model when it exposes ``resize_spec``
            (``ChatTransformersVLM`` does), else Qwen2.5-VL's defaults.
        speculator_resize: the same for the small model.
        store: the image store: which image references are accepted (its ``policy``), where
            crops and inputs are kept (its ``blobs``), decode cache and memory budget.
        limits: deadlines, question and image counts, ceilings for per-run overrides.
        on_error: ``record`` (a failed query returns with ``error`` set: right for batches)
            or ``raise`` (the run fails with :class:`SpecEyesError`: right for servers).
        loop: the agent loop's protocol options (:class:`LoopOptions`; defaults: the
            published DeepEyes format, stop strings on each step).
        speculation_depth: tool steps the small model may take, on a query the judge sends
            to the tools, before its answer is gated with ``gate.tau_depth`` (default 0: the
            paper's tool-free speculation only; per run: context ``speculation_depth``, up to
            ``limits.max_speculation_depth``, and ``tau_depth``). See
            :mod:`speceyes_graph.tool_speculation`.
        speculator_tools: the small loop's tools; by default the agent's toolset built for
            the small model's image frame (``speculator_resize``), or the same list of tools
            when ``tools`` is one. Give a toolset whose coordinates match the small model's
            grounding (Qwen3-VL: ``coordinates = "thousand"``).
        speculator_prompts: the small loop's prompts (default: the agent's).
        speculator_step_tokens: the generation length of each small-loop turn, passed as
            ``max_tokens`` (None: the small model's own setting, often a draft's few tokens).
    """
    store = store or default_store()
    limits = limits or Limits()
    resize = resize or getattr(agent, "resize_spec", None) or ResizeSpec()
    tool_list: list[BaseTool] = []
    chosen: Protocol | Literal["auto"] = protocol
    if agent is not None:
        if isinstance(tools, Sequence) and not isinstance(tools, str):
            tool_list = list(tools)
        else:
            tool_list = build_tools(load_toolset(tools), resize=resize, store=store)
        if chosen == "auto":
            chosen = _AUTO_PROTOCOL.get(tuple(t.name for t in tool_list), "native")
    thyme = chosen == "thyme"
    # cast: the loops (agent, small, SpecReason) are built only with an agent, for which
    # "auto" was resolved above
    loop_protocol = cast(Protocol, chosen)
    online: OnlineGate | None = None
    online_steps: OnlineSteps | None = None  # built with the agent loop, which labels drafts
    if isinstance(gate, OnlineGate):
        if agent is None:
            raise ValueError("an online gate learns from the agent's answers: give agent=...")
        online, gate = gate, gate.config
    gate = (
        GateConfig.load(gate)
        if isinstance(gate, (str, Path))
        else (gate or GateConfig(tau=THYME_TAU if thyme else GateConfig().tau))
    )
    prompts = prompts or (Prompts.thyme() if thyme else Prompts())
    if max_agent_steps is None:
        max_agent_steps = THYME_MAX_STEPS if thyme else DEFAULT_MAX_STEPS
    speculator_resize = speculator_resize or getattr(speculator, "resize_spec", None) or resize
    judge_kwargs: dict[str, Any] = {"max_tokens": judge_max_tokens} if judge_max_tokens else {}
    draft_kwargs: dict[str, Any] = {"max_tokens": draft_max_tokens} if draft_max_tokens else {}
    if speculation not in ("parallel", "after_judge"):
        raise ValueError(f"speculation must be 'parallel' or 'after_judge', got {speculation!r}")
    if mode not in ("speceyes", "agent", "small", "specreason"):
        raise ValueError(f"unknown mode {mode!r}; use 'speceyes', 'agent', 'small' or 'specreason'")
    if on_error not in ("record", "raise"):
        raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
    if mode in ("speceyes", "agent", "specreason") and agent is None:
        raise ValueError(f"mode {mode!r} needs an agent model (agent=...)")
    if mode in ("speceyes", "small", "specreason") and speculator is None:
        raise ValueError(f"mode {mode!r} needs a speculator model (speculator=...)")
    if not 0 <= speculation_depth <= limits.max_speculation_depth:
        raise ValueError(
            f"speculation_depth must be 0..{limits.max_speculation_depth}, got {speculation_depth}"
        )
    if not 1 <= max_agent_steps <= limits.max_agent_steps:
        raise ValueError(
            f"max_agent_steps must be 1..{limits.max_agent_steps}, got {max_agent_steps}"
        )
    judge_raw = speculator if speculator_as_judge else (judge or agent)
    judge_resize = speculator_resize if speculator_as_judge else resize
    available: set[str] = set()
    if agent is not None:
        available.add("agent")
    if speculator is not None:
        available.add("small")
        if judge_raw is not None and agent is not None:
            available.add("speceyes")
        if agent is not None and chosen in ("deepeyes", "thyme"):  # text protocols only
            available.add("specreason")
    if mode == "specreason" and "specreason" not in available:
        raise ValueError(
            f"mode 'specreason' drafts steps of a text protocol (deepeyes or thyme), not {chosen!r}"
        )
    defaults = RunSettings(
        tau=gate.tau,
        k=gate.k,
        aggregation=gate.aggregation,
        mode=mode,
        max_agent_steps=max_agent_steps,
        query_timeout_s=limits.query_timeout_s,
        model_timeout_s=limits.model_timeout_s,
        tool_timeout_s=limits.tool_timeout_s,
        on_error=on_error,
        speculation_depth=speculation_depth,
        tau_depth=gate.tau_depth,
    )
    judge_model = _internal(judge_raw, "judge")
    parallel = speculation == "parallel" and "speceyes" in available
    drafts = StartedDrafts()
    # Every judge and draft call is announced to its model's batch worker as soon as it is
    # certain (ChatTransformersVLM.announce): the query's first calls at intake, a draft the
    # judge found tool-free when it says so; the calls themselves then say announced=True.
    calls = {"judge": (judge_raw, judge_kwargs), "speculator": (speculator, draft_kwargs)}
    at_intake = {
        "judge": ("speceyes",),
        "speculator": ("small", "speceyes") if parallel else ("small",),
    }
    speculator_model = _internal(speculator, "speculator")
    token_models = [m for m in (judge_raw, speculator, agent) if m is not None]

    graph = PixelFreeGraph(
        SpecEyesState,
        input_schema=SpecEyesInput,
        output_schema=SpecEyesOutput,
        context_schema=SpecEyesContext,
    )
    # data: URLs are kept in this graph's store as LangGraph takes the input, and as anything
    # else writes them (update_state): checkpoints and saved writes hold their blob:// keys
    graph.keep_input = functools.partial(pixel_free_input, store=store)
    graph.channels["images"] = RunInput(list, keep=functools.partial(pixel_free, store=store))

    def failed(
        state: Mapping[str, Any], phase: str, exc: BaseException, t0: float
    ) -> dict[str, Any]:
        message = f"{phase}: {type(exc).__name__}: {exc}"
        log.info("query failed in %s: %s", phase, exc)
        if (state.get("settings") or {}).get("on_error", on_error) == "raise":
            raise SpecEyesError(message) from exc
        return {"error": message, "timings": {phase: time.perf_counter() - t0}}

    # What each of the graph's models can do, looked up once: reading a trait through
    # pydantic bindings costs about 0.1 ms, and every model call asks.
    known_traits: dict[int, tuple[bool, bool]] = {}

    def traits(model: Any) -> tuple[bool, bool]:
        """(takes announcements, honours deadlines itself) of one of this graph's models."""
        found = known_traits.get(id(model))
        if found is None:
            found = known_traits[id(model)] = (announces(model), handles_deadlines(model))
        return found

    def call_model(
        state: SpecEyesState,
        model: Any,
        messages: Callable[[], list[BaseMessage]],
        what: str,
        announced: bool = True,
        **kwargs: Any,
    ) -> Steps:
        """A model call within the query's deadline: the messages are built (images resized,
        read, encoded) off the event loop, then the call is made (``reply = yield from``)."""
        takes_announcements, own_deadlines = traits(model)
        if announced and takes_announcements:
            kwargs["announced"] = True  # see `calls` above
        with deadline_scope(state.get("deadline")), store_scope(store):
            check_deadline(what)
            wire = yield Blocking(lambda: for_model(messages(), model, store))
            return (
                yield ModelCall(
                    model,
                    wire,
                    what,
                    timeout=state["settings"]["model_timeout_s"],
                    inline=own_deadlines,
                    kwargs=kwargs,
                )
            )

    # --- intake: a clean run, a checked query ---------------------------------------------------
    def intake(
        state: SpecEyesState, runtime: Runtime[SpecEyesContext], config: RunnableConfig
    ) -> Steps:
        t0 = time.perf_counter()
        clean = {**_CLEAN_RUN, "timings": Overwrite({})}
        try:
            overrides = run_overrides(runtime.context, config)
            settings = resolve_settings(overrides, defaults, limits)
        except Exception as exc:
            return {**clean, **_overwrite_timings(failed({}, "settings", exc, t0))}
        clean["settings"] = settings.as_dict()
        if online_steps is not None:
            clean["gate_key"] = online_steps.key(config, overrides, settings.mode)
        clean["deadline"] = deadline = time.time() + settings.query_timeout_s
        announced: list[tuple[Any, dict[str, Any]]] = []
        try:
            if settings.mode not in available:
                raise ValueError(
                    f"mode {settings.mode!r} needs models this graph was built without "
                    f"(available modes: {sorted(available)})"
                )

            def check_and_decode() -> Query:  # reads files and URLs: off the loop
                with deadline_scope(deadline):
                    query = read_query(state, store, limits, token_models)
                    # Tell the models' batch workers which calls this query will make,
                    # before the images are decoded: a batch forming meanwhile waits for them.
                    for what, modes in at_intake.items():
                        model, kwargs = calls[what]
                        if settings.mode in modes and traits(model)[0]:
                            bare_model(model).announce(**kwargs)
                            announced.append((model, kwargs))
                    for ref in query["images"]:
                        store.get(ref)  # decode now: a broken image fails here, before any model
                return query

            query = yield Blocking(check_and_decode)
        except Exception as exc:
            for model, kwargs in announced:  # those calls will not come
                bare_model(model).announce(-1, **kwargs)
            return {**clean, **_overwrite_timings(failed(clean, "input", exc, t0))}
        return {
            **clean,
            "query": query,
            "route": "agent-only" if settings.mode == "agent" else None,
            "timings": Overwrite({"intake": time.perf_counter() - t0}),
        }

    # Routers return edge labels (drawn on the workflow picture); the path maps below name
    # the node each label leads to.

    # --- phase I ----------------------------------------------------------------------------------
    def judge_node(state: SpecEyesState, runtime: Runtime[SpecEyesContext]) -> Steps:
        t0 = time.perf_counter()
        query = state["query"]
        ticket = (yield from drafts.start(draft_reply(state))) if parallel else None
        try:
            text = prompts.question(query["question"], query["options"]) + prompts.judge_suffix

            def messages() -> list[BaseMessage]:
                image = user_message(query["images"], text, judge_resize, store)
                return [SystemMessage(content=prompts.judge_system), image]

            reply = yield from call_model(state, judge_model, messages, "judge", **judge_kwargs)
            output = message_text(reply).strip()
        except Exception as exc:
            drafts.abandon(ticket)
            return failed(state, "judge", exc, t0)
        update: dict[str, Any] = {
            "judge_output": output,
            "route": None if parse_judge(output) else "judged-agentic",
            "timings": {"judge": time.perf_counter() - t0},
        }
        if ticket is not None and update["route"] == "judged-agentic":
            update["draft"] = {"text": "", "accepted": False, "discarded": True}
            update["draft"]["note"] = drafts.abandon(ticket)
        elif ticket is not None:
            update["pending_draft"] = ticket
        elif update["route"] is None and traits(speculator)[0]:  # the draft comes next
            bare_model(speculator).announce(**draft_kwargs)
        if online_steps is not None and update["route"] == "judged-agentic":
            yield from online_steps.no_draft(state.get("gate_key"), runtime.store)
        return update

    def after_judge(state: SpecEyesState) -> str:
        if state.get("error"):
            return "failed"
        if state.get("route") != "judged-agentic":
            return "no"
        return "yes, speculate with tools" if state["settings"].get("speculation_depth") else "yes"

    # --- phase II ---------------------------------------------------------------------------------
    def draft_reply(state: SpecEyesState) -> Steps:
        query = state["query"]
        text = prompts.question(query["question"], query["options"]) + prompts.speculator_suffix

        def messages() -> list[BaseMessage]:
            image = user_message(query["images"], text, speculator_resize, store)
            return [SystemMessage(content=prompts.speculator_system), image]

        return (
            yield from call_model(state, speculator_model, messages, "speculator", **draft_kwargs)
        )

    def speculate_node(state: SpecEyesState) -> Steps:
        t0 = time.perf_counter()
        settings = state["settings"]
        try:
            # drafted while the judge ran (parallel speculation), else drafted now
            started = drafts.take(state.get("pending_draft"))
            if started is not None:
                with deadline_scope(state.get("deadline")):
                    reply = yield Collect(started, timeout=time_left(settings["model_timeout_s"]))
            else:
                reply = yield from draft_reply(state)
        except Exception as exc:
            if type(exc) is TimeoutError:  # Collect's own wait
                exc = DeadlineExceeded("the draft started beside the judge did not finish in time")
            if settings["mode"] == "small":
                return failed(state, "speculator", exc, t0)
            draft: Draft = {
                "text": "",
                "accepted": False,
                "error": f"speculator: {type(exc).__name__}: {exc}",
            }
            return {"draft": draft, "timings": {"speculate": time.perf_counter() - t0}}
        gate_config = RunSettings(**settings).gate(gate)
        draft = {"text": message_text(reply).strip(), **score_draft(reply, gate_config)}
        batch_size = (getattr(reply, "response_metadata", None) or {}).get("batch_size")
        if isinstance(batch_size, int):
            draft["batch_size"] = batch_size
        if not draft["text"]:
            draft.update({"accepted": False, "error": draft.get("error") or "the draft is empty"})
        return {"draft": draft, "timings": {"speculate": time.perf_counter() - t0}}

    # --- phase III --------------------------------------------------------------------------------
    def gate_node(state: SpecEyesState, runtime: Runtime[SpecEyesContext]) -> Steps:
        draft = state.get("draft") or {}
        if state["settings"]["mode"] == "small":
            return {"answer": draft.get("text") or None, "route": "draft-only"}
        update: dict[str, Any] = {}
        if online_steps is not None and state.get("gate_key"):
            draft = update["draft"] = yield from online_steps.decide(state, draft, runtime.store)
        if draft.get("accepted"):
            return {**update, "answer": draft.get("text"), "route": "speculative"}
        return {**update, "route": "rejected-agentic"}

    def after_gate(state: SpecEyesState) -> str:
        if state.get("route") == "rejected-agentic":
            return "reject"
        return "failed" if state.get("error") else "accept"

    # --- depth-D speculation: the small model's own tool loop (tool_speculation) ----------------
    if "speceyes" in available and speculator is not None:  # it is: "speceyes" needs one
        if speculator_tools is None:
            speculator_tools = tools if isinstance(tools, (str, Path, Toolset)) else tool_list
        small_loop = create_agent_loop(
            speculator,
            list(speculator_tools)
            if isinstance(speculator_tools, Sequence) and not isinstance(speculator_tools, str)
            else build_tools(load_toolset(speculator_tools), resize=speculator_resize, store=store),
            protocol=loop_protocol,
            max_steps=limits.max_speculation_depth + 1,
            prompts=speculator_prompts or prompts,
            resize=speculator_resize,
            store=store,
            options=dataclasses.replace(loop or LoopOptions(), on_step_limit="error"),
            keep_logprobs=True,
            name="small_agent",
            max_tokens=speculator_step_tokens,
        ).compile(name="small_loop")
        tagged = chosen in ("deepeyes", "thyme")  # answers in <answer> tags: gate those tokens
        graph.add_node("speculate_tools", node(speculate_tools_node(small_loop, gate, tagged)))
        graph.add_conditional_edges(
            "speculate_tools",
            router(after_tool_gate),
            {"accept": END, "reject": "agent_loop"},
        )

    # --- phase IV ---------------------------------------------------------------------------------
    if agent is not None:
        compiled_loop = create_agent_loop(
            agent,
            tool_list,
            protocol=loop_protocol,
            max_steps=max_agent_steps,
            prompts=prompts,
            resize=resize,
            store=store,
            options=loop,
        ).compile(name="agent_loop")

        def loop_input(
            state: Mapping[str, Any], draft: Draft, deadline: float | None
        ) -> AgentLoopInput:
            query, settings = state["query"], state["settings"]
            return {
                "question": query["question"],
                "images": query["images"],
                "options": query["options"],
                "draft": None if draft.get("discarded") else (draft or None),
                "max_steps": settings["max_agent_steps"],
                "deadline": deadline,
                "model_timeout_s": settings["model_timeout_s"],
                "tool_timeout_s": settings["tool_timeout_s"],
            }

        def agent_loop(state: SpecEyesState) -> Steps:
            t0 = time.perf_counter()
            settings = state["settings"]
            try:
                with deadline_scope(state.get("deadline")):
                    check_deadline("agent loop")
                # The loop runs without checkpoints of its own: its transcript reaches the
                # parent state once, at the end, instead of being stored again at every step
                # (a resumed run restarts the loop). `compiled_loop` itself stays the subgraph
                # that get_graph(xray=True) and Studio draw.
                out = yield Subgraph(
                    compiled_loop.copy(update={"checkpointer": False}),
                    loop_input(state, state.get("draft") or {}, state.get("deadline")),
                    {"recursion_limit": recursion_limit(settings["max_agent_steps"])},
                )
            except DeadlineExceeded as exc:
                out = {**failed(state, "agent", exc, t0), "stop_reason": "deadline"}
            except Exception as exc:
                out = failed(state, "agent", exc, t0)
            if online_steps is not None and state.get("route") == "rejected-agentic":
                failed_loop = bool(out.get("error")) or not out.get("answer")
                yield from online_steps.rejected(state, out.get("answer"), failed_loop)
            if out.get("error") and settings["on_error"] == "raise":
                raise SpecEyesError(out["error"])
            return out

        def shadow_answer(state: Mapping[str, Any], draft: Draft) -> str | None:
            """The agent's answer to a query whose draft was accepted (a shadow run: in a
            thread of its own, with a deadline of its own, traced as its own run)."""
            settings = state["settings"]
            deadline = time.time() + settings["query_timeout_s"]
            config: RunnableConfig = {
                "recursion_limit": recursion_limit(settings["max_agent_steps"]),
                "run_name": "shadow_verification",
                "tags": ["speceyes:shadow"],
                "metadata": {"gate_key": state.get("gate_key")},
            }
            loop = compiled_loop.copy(update={"checkpointer": False})
            out = loop.invoke(loop_input(state, draft, deadline), config)
            if out.get("error") or not out.get("answer"):
                raise RuntimeError(out.get("error") or "the shadow run gave no answer")
            return str(out["answer"])

        if online is not None:
            online_steps = OnlineSteps(online, shadow_answer)

        graph.add_node("agent_loop", node(agent_loop))
        graph.add_edge("agent_loop", END)

    # --- the SpecReason baseline -----------------------------------------------------------------
    if "specreason" in available:
        reason_system = agent_system_prompt(loop_protocol, prompts, tool_list)
        small_reasoner = _internal(speculator, "specreason_small")
        large_reasoner = _internal(agent, "specreason_large")

        def specreason_node(state: SpecEyesState) -> Steps:
            t0 = time.perf_counter()
            query = state["query"]

            def call(model: Any, messages: list[BaseMessage], what: str, **kwargs: Any) -> Steps:
                return call_model(state, model, lambda: messages, what, announced=False, **kwargs)

            try:
                with deadline_scope(state.get("deadline")), store_scope(store):
                    first = yield Blocking(first_user_message, (
                        loop_protocol, prompts, query["question"], query["images"], query["options"],
                        resize, store,
                    ))  # fmt: skip
                    out = yield from run_specreason(
                        call=call, small=small_reasoner, large=large_reasoner,
                        system=reason_system, first=first, protocol=loop_protocol, tools=tool_list,
                        images=query["images"], prompts=prompts, store=store, emit=emit_event,
                    )  # fmt: skip
            except DeadlineExceeded as exc:
                return {**failed(state, "specreason", exc, t0), "stop_reason": "deadline"}
            except Exception as exc:
                return failed(state, "specreason", exc, t0)
            return {
                **out,
                "route": "specreason",
                "timings": {"specreason": time.perf_counter() - t0},
            }

        graph.add_node("specreason", node(specreason_node))
        graph.add_edge("specreason", END)

    def after_intake(state: SpecEyesState) -> str:
        return "invalid" if state.get("error") else state["settings"]["mode"]

    graph.add_node("intake", node(intake))
    graph.add_edge(START, "intake")
    graph.add_conditional_edges(
        "intake",
        router(after_intake),
        {**{m: _FIRST_NODE[m] for m in sorted(available)}, "invalid": END},
    )
    if speculator is not None:
        graph.add_node("speculate", node(speculate_node))
        graph.add_node("gate", node(gate_node))
        graph.add_edge("speculate", "gate")
        graph.add_conditional_edges(
            "gate",
            router(after_gate),
            {
                "accept": END,
                "failed": END,
                **({"reject": "agent_loop"} if agent is not None else {}),
            },
        )
    if "speceyes" in available:
        graph.add_node("judge", node(judge_node))
        graph.add_conditional_edges(
            "judge",
            router(after_judge),
            {
                "no": "speculate",
                "yes": "agent_loop",
                "yes, speculate with tools": "speculate_tools",
                "failed": END,
            },
        )
    return graph


def announces(model: Any) -> bool:
    """Whether a model takes announcements of calls to come (``announce``)."""
    return callable(getattr(bare_model(model), "announce", None))


def handles_deadlines(model: Any) -> bool:
    """Whether a model (or a binding of one) honours the deadline context itself."""
    return bool(getattr(bare_model(model), "handles_deadlines", False))


def _internal(model: BaseChatModel | None, name: str) -> Any:
    """Internal model calls: hidden from stream_mode="messages", named in traces."""
    return None if model is None else model.with_config(tags=[TAG_NOSTREAM], run_name=name)


def _overwrite_timings(update: dict[str, Any]) -> dict[str, Any]:
    return {**update, "timings": Overwrite(update.get("timings") or {})}


def score_draft(reply: Any, gate: GateConfig) -> Draft:
    """Gate fields for a speculator reply; a draft that cannot be scored is rejected, with why.

    Log-probs come from a model or a server and are untrusted: any malformed shape becomes a
    recorded rejection, never an exception.
    """
    logprobs = (getattr(reply, "response_metadata", None) or {}).get("logprobs")
    if not logprobs:
        log.warning(
            "speculator reply has no logprobs; the draft is rejected (request top_logprobs=K)"
        )
    return gate.decide(logprobs)
