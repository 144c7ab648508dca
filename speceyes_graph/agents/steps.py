"""The agent loop's steps (:func:`~speceyes_graph.agents.loop.create_agent_loop` wires them):
a model turn, the route after it, the correction, the tool calls and the finish, with the
state they share and the trace they leave.

They are one object's methods because every step reads the same settings, fixed when the
loop is built (protocol, prompts, image store, bound model); the per-query ones (deadline,
timeouts, this run's ``max_steps``) come with the state.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import Runnable
from langgraph.config import get_stream_writer
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from speceyes_tools.deadlines import (
    DeadlineExceeded,
    acall_with_deadline,
    call_with_deadline,
    check_deadline,
    deadline_scope,
    to_worker_thread,
)
from speceyes_tools.images import ImageStore, ResizeSpec, store_scope
from speceyes_tools.python_tool import sandbox_image_path

from ..effects import Blocking, ModelCall, Steps, unavailable
from ..messages import Protocol, bare_model, dehydrate, for_model, to_wire, user_message
from ..prompts import Prompts, thyme_user_prompt
from ..protocol import extract_answer, message_text, parse_deepeyes, parse_thyme
from ..state import AgentStep, Draft, merge_timings

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command


__all__ = [
    "LoopOptions",
    "AgentLoopInput",
    "AgentLoopOutput",
    "AgentLoopState",
    "LoopSteps",
    "ScoredStep",
    "attach_tool_results",
    "emit_event",
    "first_user_message",
    "no_tools",
    "tool_error",
    "tool_trace",
]


@dataclass(frozen=True)
class LoopOptions:
    """How the agent loop (phase IV) runs: its protocol, its step bound, and how it speaks the
    DeepEyes text protocol.

    ``protocol``: ``deepeyes`` (tool calls as text), ``thyme`` (the model writes Python that
    runs in the OS sandbox), ``native`` (structured tool calls), or ``auto``
    (:func:`resolve_protocol`: ``deepeyes`` when the tools are exactly
    ``image_zoom_in_tool``, ``thyme`` when exactly ``python_sandbox``, else ``native``).
    ``max_steps``: model turns (tool rounds included); None: 6, or Thyme's published 5.

    The text options' defaults are the published format (the SpecEyes evaluation, as
    DeepEyes was trained); each is an improvement that changes what the model sees, so it
    is off unless asked for."""

    protocol: Protocol | Literal["auto"] = "auto"
    max_steps: int | None = None
    stop: tuple[str, ...] = ("</tool_call>", "</answer>")  # stop strings of an agent step
    tool_response_text: bool = False  # also send the tool's text (box, size) in <tool_response>
    explain_problems: bool = False  # say what was wrong with a turn (published: repeat the nudge)
    on_step_limit: Literal["answer", "error"] = "answer"  # error: the published behaviour


class AgentLoopInput(TypedDict, total=False):
    question: str
    images: list[str]
    options: list[str] | None
    draft: Draft | None
    max_steps: int | None  # this run's bound (default: the one the loop was built with)
    deadline: float | None  # absolute, time.time() seconds
    model_timeout_s: float | None
    tool_timeout_s: float | None


class AgentLoopOutput(TypedDict, total=False):
    answer: str | None
    agent_messages: list[AnyMessage]
    agent_steps: list[AgentStep]
    stop_reason: str | None
    error: str | None
    timings: Annotated[dict[str, float], merge_timings]


class ScoredStep(AgentStep, total=False):
    """The step that answers, with ``keep_logprobs``: its reply's log-probs for the gate."""

    logprobs: Any  # OpenAI-format, as the model's response_metadata carries them


class AgentLoopState(AgentLoopInput, AgentLoopOutput, total=False):
    messages: Annotated[list[AnyMessage], add_messages]  # private working transcript
    steps: Annotated[list[AgentStep], operator.add]  # private: one per model turn
    correction: str | None  # private: what to tell the model after a turn it cannot act on
    started_at: float


@dataclass(frozen=True, kw_only=True, eq=False)  # eq=False: hashed by identity
class LoopSteps:
    """The loop's nodes and routers, as methods (their names are the graph's: ``agent``,
    ``correct``, ``finish``, ``route``, ``after_tools``; ``run_tool``/``arun_tool`` wrap
    each tool call).

    ``model`` is the chat model as given (its settings decide how a Thyme turn continues
    and whether it keeps its own deadlines); ``bound`` is what a turn calls (tools bound,
    traced as ``{name}_model``); ``system`` is added only when the model is called, so the
    stored transcript stays without it."""

    model: BaseChatModel
    bound: Runnable[Any, Any]
    protocol: Protocol
    prompts: Prompts
    options: LoopOptions
    store: ImageStore
    resize: ResizeSpec | None
    system: str
    tool_names: frozenset[str]
    max_steps: int
    turn_kwargs: dict[str, Any]  # stop strings and generation length of every turn
    keep_logprobs: bool
    name: str

    # -- the model turn (the ``agent`` node) --------------------------------------------

    def agent(self, state: AgentLoopState) -> Steps:
        """One model turn. A failed or late model call fails only this query (``error``),
        so a batch goes on."""
        started = state.get("started_at") or time.time()
        history = list(state.get("messages") or [])
        new: list[AnyMessage] = []
        try:
            with deadline_scope(state.get("deadline")), store_scope(self.store):
                check_deadline("agent loop")
                new, wire, messages = yield Blocking(self.prepare, (state, history))
                t0 = time.perf_counter()
                reply = yield ModelCall(
                    self.bound,
                    messages,
                    "agent model call",
                    timeout=state.get("model_timeout_s"),
                    inline=self.own_deadlines,
                    kwargs={**self.turn_kwargs, **self.continuation(wire)},
                )
                latency = time.perf_counter() - t0
        except Exception as exc:  # the model failed: this query fails, the batch goes on
            return {
                "started_at": started,
                "messages": new,
                "error": f"agent model: {type(exc).__name__}: {exc}",
                "stop_reason": (
                    "deadline"
                    if isinstance(exc, DeadlineExceeded)
                    else "unavailable"
                    if unavailable(exc)
                    else "error"
                ),
            }
        return self.record(state, started, new, reply, latency)

    def prepare(
        self, state: AgentLoopState, history: list[AnyMessage]
    ) -> tuple[list[AnyMessage], list[BaseMessage], list[BaseMessage]]:
        """(new messages, the transcript as the protocol sends it, as the model takes it).
        Blocking work (images decoded and encoded), so the async path runs it off the loop."""
        # cast: the loop's callers always send the question; without one, format_question
        # (Prompts.question) still fails the turn with its own message
        new: list[AnyMessage] = [] if history else [
            first_user_message(
                self.protocol, self.prompts, cast(str, state.get("question")),
                state.get("images"), state.get("options"), self.resize, self.store,
            )
        ]  # fmt: skip
        wire = to_wire(
            history + new,
            self.protocol,
            self.prompts.tool_response_instruction,
            self.options.tool_response_text,
        )
        return (
            new,
            wire,
            [SystemMessage(content=self.system), *for_model(wire, self.model, self.store)],
        )

    @property
    def own_deadlines(self) -> bool:
        """The model keeps deadlines itself, so the sync path needs no watchdog thread."""
        return bool(getattr(bare_model(self.model), "handles_deadlines", False))

    def continuation(self, wire: list[BaseMessage]) -> dict[str, Any]:
        """Extra call arguments when a served model must continue Thyme's assistant turn.

        vLLM and SGLang continue the last assistant message only when told to
        (``continue_final_message``); a local ChatTransformersVLM does it by itself."""
        served = hasattr(bare_model(self.model), "extra_body") and self.protocol == "thyme"
        if not (served and wire and isinstance(wire[-1], AIMessage)):
            return {}
        return {
            "extra_body": {
                **(getattr(bare_model(self.model), "extra_body", None) or {}),
                "continue_final_message": True,
                "add_generation_prompt": False,
            }
        }

    def record(
        self,
        state: AgentLoopState,
        started: float,
        new: list[AnyMessage],
        reply: Any,
        latency: float,
    ) -> dict[str, Any]:
        """The turn's update: its message, its step (streamed as ``{name}_step``) and what
        the loop does next (an answer, a correction, or an end)."""
        text = message_text(reply)
        calls, problems, answer = self.read(reply, text)
        new.append(AIMessage(content=text, tool_calls=calls, id=getattr(reply, "id", None)))
        step: AgentStep = {
            "step": len(state.get("steps") or []) + 1,
            "model_text": text,
            "model_latency_s": latency,
            "tool_calls": [
                {"name": c["name"], "arguments": c["args"], "id": c["id"]} for c in calls
            ],
            "answer": answer,
            "problem": "; ".join(problems) or None,
        }
        correction: str | None = None
        ended: str | None = None
        if not calls and answer is None:
            if self.protocol == "thyme":
                ended = "no code and no answer"  # the published loop stops here
            else:
                correction = self.nudge(problems)
                if not problems:
                    step["problem"] = "no tool call and no <answer>"
        emit_event({f"{self.name}_step": step})  # stream_mode="custom": watch the loop turn by turn
        if self.keep_logprobs and answer is not None:
            metadata = getattr(reply, "response_metadata", None) or {}
            scored: ScoredStep = {**step, "logprobs": metadata.get("logprobs")}
            step = scored  # after the event: the log-probs are for the gate, not the stream
        return {
            "started_at": started,
            "messages": new,
            "steps": [step],
            "answer": answer,
            "correction": correction,
            **({"stop_reason": ended} if ended else {}),
        }

    def read(self, reply: Any, text: str) -> tuple[list[Any], list[str], str | None]:
        """(tool calls, problems, answer) of a reply. Structured calls win; text is parsed in
        the loop's protocol, or as DeepEyes when a native model writes ``<tool_call>``."""
        native_calls = list(getattr(reply, "tool_calls", None) or [])
        if native_calls:
            unknown = [c["name"] for c in native_calls if c["name"] not in self.tool_names]
            return native_calls, [f"Error: Unknown tool name: {n}" for n in unknown], None
        if self.protocol == "thyme":
            parsed = parse_thyme(text, next(iter(self.tool_names), "python_sandbox"))
        elif self.protocol == "deepeyes" or "<tool_call>" in text:
            parsed = parse_deepeyes(text, self.tool_names)
        else:
            return [], [], extract_answer(text) or (text.strip() or None)
        return parsed.tool_calls, parsed.problems, parsed.answer

    def nudge(self, problems: list[str]) -> str:
        """What the ``correct`` node says after a turn with nothing to do: the published
        nudge (the instruction again) or, with ``explain_problems``, what went wrong first."""
        if self.options.explain_problems and problems:
            return "\n".join(problems) + "\n" + self.prompts.agent_suffix.lstrip("\n")
        return self.prompts.agent_suffix

    # -- routing and correction ---------------------------------------------------------
    # Routers return edge labels (drawn on the workflow picture).

    def steps_allowed(self, state: AgentLoopState) -> int:
        """This run's bound: the input's ``max_steps``, else the loop's."""
        return state.get("max_steps") or self.max_steps

    def route(
        self, state: AgentLoopState
    ) -> Literal["tool call", "malformed", "answer", "step limit"]:
        """After a turn. An answer, a failure or an end wins over the step limit, so a last
        turn that answers is kept; a turn with nothing to run is corrected."""
        if state.get("error") or state.get("answer") is not None or state.get("stop_reason"):
            return "answer"
        if len(state.get("steps") or []) >= self.steps_allowed(state):
            return "step limit"
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tool call"
        return "malformed"

    def correct(self, state: AgentLoopState) -> dict[str, Any]:
        """Tell the model what the turn lacked (the turn set it: see :meth:`nudge`)."""
        return {"messages": [HumanMessage(content=state["correction"])]}

    def after_tools(self, state: AgentLoopState) -> Literal["continue", "step limit"]:
        """After a tool round: back to the model, unless its turns are spent (the tool
        round counts with the turn that asked for it)."""
        return (
            "step limit"
            if len(state.get("steps") or []) >= self.steps_allowed(state)
            else "continue"
        )

    # -- the tool calls (``ToolNode`` wrappers) -----------------------------------------

    def run_tool(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Each tool call: within the query's deadline and the tool timeout; pixels to the store."""
        state = request.state if isinstance(request.state, dict) else {}
        try:
            with deadline_scope(state.get("deadline")):
                result = call_with_deadline(
                    execute,
                    request,
                    timeout=state.get("tool_timeout_s"),
                    what=f"tool {request.tool_call['name']}",
                )
        except DeadlineExceeded as exc:
            result = _deadline_message(request, exc)
        return dehydrate(result, self.store) if isinstance(result, ToolMessage) else result

    async def arun_tool(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """``run_tool`` under ``ainvoke``: the tool runs in a worker thread (LangChain runs a
        sync tool's ``ainvoke`` there), the result is moved into the store off the loop."""
        state = request.state if isinstance(request.state, dict) else {}
        try:
            with deadline_scope(state.get("deadline")):
                result = await acall_with_deadline(
                    execute,
                    request,
                    timeout=state.get("tool_timeout_s"),
                    what=f"tool {request.tool_call['name']}",
                )
        except DeadlineExceeded as exc:
            result = _deadline_message(request, exc)
        if isinstance(result, ToolMessage):
            result = await to_worker_thread(dehydrate, result, self.store)
        return result

    # -- the end (the ``finish`` node) --------------------------------------------------

    def finish(self, state: AgentLoopState) -> dict[str, Any]:
        """The loop's output: the answer, why it stopped, the transcript and the steps with
        their tool results (copies: the state's steps and the streamed events stay as sent)."""
        steps = [dict(s) for s in state.get("steps") or []]
        attach_tool_results(steps, state.get("messages") or [])
        answer, reason, error = self.outcome(state, len(steps))
        elapsed = time.time() - (state.get("started_at") or time.time())
        return {
            **({"error": error} if error else {}),
            "answer": answer,
            "stop_reason": reason,
            "agent_messages": list(state.get("messages") or []),
            "agent_steps": steps,
            "timings": {"agent": elapsed},
        }

    def outcome(self, state: AgentLoopState, n_steps: int) -> tuple[str | None, str, str | None]:
        """(answer, stop reason, error). A loop that stops without an answer falls back on
        the rejected draft, unless ``on_step_limit="error"`` asks for the published failure."""
        answer = state.get("answer")
        if state.get("error"):
            return answer, state.get("stop_reason") or "error", None
        if answer is not None:
            return answer, "answered", None
        if stopped := state.get("stop_reason"):
            answer = (state.get("draft") or {}).get("text") or None
            return answer, stopped + (", answered with the draft" if answer else ""), None
        if self.options.on_step_limit == "error":
            return answer, "step_limit", f"agent: no answer after {n_steps} steps (step limit)"
        answer = (state.get("draft") or {}).get("text") or None
        return (
            answer,
            "step_limit, answered with the draft" if answer else "step_limit, no answer",
            None,
        )


def first_user_message(
    protocol: Protocol,
    prompts: Prompts,
    question: str,
    images: Sequence[str] | None,
    options: Sequence[str] | None,
    resize: ResizeSpec | None,
    store: ImageStore,
) -> HumanMessage:
    """The agent's first user turn: images first, then the protocol's text. Thyme's text
    says where the sandbox finds the first image and its original size."""
    if protocol == "thyme":
        path, size = sandbox_image_path(images[0], store) if images else ("(no image)", (0, 0))
        text = thyme_user_prompt(prompts.agent_question(question, options), path, size)
    else:
        text = prompts.question(question, options)
        if protocol == "deepeyes":
            text += prompts.agent_suffix
    return user_message(images, text, resize, store)


def emit_event(event: dict[str, Any]) -> None:
    try:
        get_stream_writer()(event)
    except RuntimeError:  # called outside a graph run (no stream context)
        pass


def tool_error(exc: Exception) -> str:
    """A tool's exception as the tool's answer: the model reads it and may try again."""
    return f"Error: {type(exc).__name__}: {exc}"


def _deadline_message(request: Any, exc: DeadlineExceeded) -> ToolMessage:
    return ToolMessage(
        content=f"Error: {exc}",
        tool_call_id=request.tool_call["id"],
        name=request.tool_call["name"],
        status="error",
    )


def no_tools(state: AgentLoopState) -> dict[str, Any]:
    """The ``tools`` node of a loop built without tools: each call is answered, so the
    transcript stays well formed and the model is told to answer."""
    # route() sends a turn here only when it is an AIMessage with tool calls
    last = cast(AIMessage, state["messages"][-1])
    return {
        "messages": [
            ToolMessage(
                content="Error: no tools are available; answer directly.",
                tool_call_id=c["id"],
                name=c["name"],
            )
            for c in last.tool_calls
        ]
    }


TRACE_KEYS = ("box", "notes", "latency_s")  # a vision tool's: box after clamping
CODE_TRACE_KEYS = ("code", "stdout", "stderr", "images", "overhead_s", "timed_out")


def tool_trace(artifact: dict[str, Any]) -> dict[str, Any]:
    """The fields of a tool's artifact that a step records (vision tools and the code tool)."""
    return {k: artifact[k] for k in TRACE_KEYS + CODE_TRACE_KEYS if k in artifact}


def attach_tool_results(steps: list[dict[str, Any]], messages: Sequence[BaseMessage]) -> None:
    """Copy each tool result's trace (box after clamping, latency, error) into its step."""
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    for step in steps:  # new dicts: the state's steps and the streamed events stay as they were
        step["tool_calls"] = [
            _with_result(c, results.get(c.get("id"))) for c in step.get("tool_calls", [])
        ]


def _with_result(call: dict[str, Any], tm: ToolMessage | None) -> dict[str, Any]:
    if tm is None:
        return call
    artifact = tm.artifact if isinstance(tm.artifact, dict) else {}
    failed = tm.status == "error" or message_text(tm).startswith("Error")
    return {
        **call,
        "box": None,
        "notes": None,
        "latency_s": None,
        **tool_trace(artifact),
        "error": message_text(tm) if failed else None,
    }
