"""Phase IV: the large model's tool loop, as a LangGraph subgraph named ``agent_loop``.

The standard pattern: a model node, a ``ToolNode``, and an edge back, bounded by
``max_steps`` model turns. Three protocols are spoken (see :mod:`.messages`): DeepEyes text
(``<tool_call>`` JSON in plain text, parsed here defensively), Thyme (``<code>`` blocks run
by the ``python_sandbox`` tool in an OS sandbox, the output continuing the same assistant
turn; a step with neither code nor an answer ends the loop, as published) and native tool
calling.
Everything a model writes is untrusted: malformed calls and unknown tools are recorded and
answered with a corrective message (the ``correct`` node); tool failures go back to the
model as the tool's answer; a model exception or a passed deadline fails only this query,
recorded in ``error``.

The stored transcript holds no pixels and no system prompt: images are ``blob://``
references (tool results are moved into the image store as they arrive), and the system
prompt, the same for every query, is added only when the model is called.
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
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_stream_writer
from langgraph.constants import TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from typing_extensions import TypedDict

from speceyes_tools.deadlines import (
    DeadlineExceeded,
    acall_with_deadline,
    call_with_deadline,
    check_deadline,
    deadline_scope,
    to_worker_thread,
)
from speceyes_tools.images import ImageStore, ResizeSpec, default_store, store_scope
from speceyes_tools.python_tool import sandbox_image_path

from ..effects import Blocking, ModelCall, Steps, node, router
from ..messages import Protocol, bare_model, dehydrate, for_model, to_wire, user_message
from ..prompts import (
    NATIVE_AGENT_SYSTEM_PROMPT,
    THYME_STOP,
    THYME_SYSTEM_PROMPT,
    Prompts,
    thyme_user_prompt,
    tools_system_prompt,
)
from ..protocol import extract_answer, message_text, parse_deepeyes, parse_thyme
from ..state import AgentStep, Draft, merge_timings

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command

__all__ = [
    "AgentLoopState",
    "agent_system_prompt",
    "attach_tool_results",
    "default_max_steps",
    "resolve_protocol",
    "first_user_message",
    "tool_trace",
    "DEFAULT_MAX_STEPS",
    "LoopOptions",
    "create_agent_loop",
    "recursion_limit",
]

DEFAULT_MAX_STEPS = 6
THYME_MAX_STEPS = 5  # the published harness's MAX_ITERATIONS


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


_AUTO_PROTOCOL: dict[tuple[str, ...], Protocol] = {
    ("image_zoom_in_tool",): "deepeyes",
    ("python_sandbox",): "thyme",
}


def resolve_protocol(protocol: Protocol | Literal["auto"], tools: Sequence[BaseTool]) -> Protocol:
    """The protocol ``auto`` stands for with these tools: the text protocol their one tool
    was trained with (DeepEyes' ``image_zoom_in_tool``, Thyme's ``python_sandbox``), else
    native tool calls."""
    if protocol == "auto":
        return _AUTO_PROTOCOL.get(tuple(t.name for t in tools), "native")
    if protocol not in ("deepeyes", "thyme", "native"):
        raise ValueError(
            f"unknown protocol {protocol!r}; use 'deepeyes', 'thyme', 'native' or 'auto'"
        )
    return protocol


def default_max_steps(protocol: Protocol) -> int:
    """Model turns of the loop when none are given: Thyme's published 5, else 6."""
    return THYME_MAX_STEPS if protocol == "thyme" else DEFAULT_MAX_STEPS


def recursion_limit(max_steps: int) -> int:
    """LangGraph supersteps the loop needs: a model turn plus a tool or correction per step."""
    return 2 * max_steps + 4


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


def _tool_error(exc: Exception) -> str:
    return f"Error: {type(exc).__name__}: {exc}"


def create_agent_loop(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    protocol: Protocol | Literal["auto"] | None = None,
    max_steps: int | None = None,
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
    options: LoopOptions | None = None,
    keep_logprobs: bool = False,
    name: str = "agent",
    max_tokens: int | None = None,
) -> StateGraph[AgentLoopState, None, AgentLoopInput, AgentLoopOutput]:
    """The uncompiled ``agent_loop`` subgraph.

    ``protocol`` and ``max_steps`` default to ``options``' (:class:`LoopOptions`: ``auto``,
    and 6 or Thyme's 5). ``max_steps`` bounds model turns (tool rounds included); an input ``max_steps`` overrides
    it per run. When it is reached the query ends with the best answer available: the loop's
    last ``<answer>``, else the rejected draft if there was one; ``stop_reason`` says which
    (``options.on_step_limit="error"``: the query fails, as in the published evaluation).
    Compile and invoke with ``recursion_limit=recursion_limit(max_steps)`` or more.
    ``keep_logprobs``: the turn that answers keeps its reply's log-probs in its step
    (``logprobs``; not in the streamed event), so a gate can score the answer (the small
    model's loop of depth-D speculation). ``name`` names the model's runs in traces
    (``{name}_model``) and the streamed events (``{name}_step``). ``max_tokens``: each
    turn's generation length (default: the model's own setting).
    """
    options = options or LoopOptions()
    protocol = resolve_protocol(protocol or options.protocol, tools)
    if max_steps is None:
        max_steps = options.max_steps or default_max_steps(protocol)
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    prompts = prompts or Prompts()
    store = store or default_store()
    tools = list(tools)
    tool_names = {t.name for t in tools}
    system = agent_system_prompt(protocol, prompts, tools)
    bound = model.bind_tools(tools) if protocol == "native" and tools else model
    bound = bound.with_config(tags=[TAG_NOSTREAM], run_name=f"{name}_model")
    stops = options.stop
    if protocol == "thyme" and stops == LoopOptions.stop:
        stops = THYME_STOP
    turn_kwargs: dict[str, Any] = (
        {"stop": list(stops)} if protocol in ("deepeyes", "thyme") and stops else {}
    )
    if max_tokens:
        turn_kwargs["max_tokens"] = max_tokens
    # A served model continues Thyme's assistant turn when the server is told to (vLLM and
    # SGLang: continue_final_message); a local ChatTransformersVLM does it by itself.
    served = hasattr(bare_model(model), "extra_body") and protocol == "thyme"
    own_deadlines = bool(getattr(bare_model(model), "handles_deadlines", False))
    code_tool = next(iter(tool_names), "python_sandbox")

    def steps_allowed(state: AgentLoopState) -> int:
        return state.get("max_steps") or max_steps

    def prepare(
        state: AgentLoopState, history: list[AnyMessage]
    ) -> tuple[list[AnyMessage], list[BaseMessage], list[BaseMessage]]:
        """(new messages, the transcript as the protocol sends it, as the model takes it)."""
        # cast: the loop's callers always send the question; without one, format_question
        # (Prompts.question) still fails the turn with its own message
        new: list[AnyMessage] = [] if history else [
            first_user_message(
                protocol, prompts, cast(str, state.get("question")), state.get("images"),
                state.get("options"), resize, store,
            )
        ]  # fmt: skip
        wire = to_wire(
            history + new, protocol, prompts.tool_response_instruction, options.tool_response_text
        )
        return new, wire, [SystemMessage(content=system), *for_model(wire, model, store)]

    def agent(state: AgentLoopState) -> Steps:
        started = state.get("started_at") or time.time()
        history = list(state.get("messages") or [])
        new: list[AnyMessage] = []
        step_no = len(state.get("steps") or []) + 1
        try:
            with deadline_scope(state.get("deadline")), store_scope(store):
                check_deadline("agent loop")
                new, wire, messages = yield Blocking(prepare, (state, history))
                extra = {}
                if served and wire and isinstance(wire[-1], AIMessage):
                    extra["extra_body"] = {
                        **(getattr(bare_model(model), "extra_body", None) or {}),
                        "continue_final_message": True,
                        "add_generation_prompt": False,
                    }
                t0 = time.perf_counter()
                reply = yield ModelCall(
                    bound,
                    messages,
                    "agent model call",
                    timeout=state.get("model_timeout_s"),
                    inline=own_deadlines,
                    kwargs={**turn_kwargs, **extra},
                )
                latency = time.perf_counter() - t0
        except Exception as exc:  # the model failed: this query fails, the batch goes on
            return {
                "started_at": started,
                "messages": new,
                "error": f"agent model: {type(exc).__name__}: {exc}",
                "stop_reason": "deadline" if isinstance(exc, DeadlineExceeded) else "error",
            }
        text = message_text(reply)
        native_calls = list(getattr(reply, "tool_calls", None) or [])
        if native_calls:
            calls = native_calls
            problems = [
                f"Error: Unknown tool name: {c['name']}"
                for c in calls
                if c["name"] not in tool_names
            ]
            answer = None
        elif protocol == "thyme":
            parsed = parse_thyme(text, code_tool)
            calls, problems, answer = parsed.tool_calls, parsed.problems, parsed.answer
        elif protocol == "deepeyes" or "<tool_call>" in text:
            parsed = parse_deepeyes(text, tool_names)
            calls, problems, answer = parsed.tool_calls, parsed.problems, parsed.answer
        else:
            calls, problems = [], []
            answer = extract_answer(text) or (text.strip() or None)
        new.append(AIMessage(content=text, tool_calls=calls, id=getattr(reply, "id", None)))
        step: AgentStep = {
            "step": step_no,
            "model_text": text,
            "model_latency_s": latency,
            "tool_calls": [
                {"name": c["name"], "arguments": c["args"], "id": c["id"]} for c in calls
            ],
            "answer": answer,
            "problem": "; ".join(problems) or None,
        }
        correction = None
        ended = None
        if protocol == "thyme" and not calls and answer is None:
            ended = "no code and no answer"  # the published loop stops here
        elif not calls and answer is None:
            # nothing to do: the `correct` node sends the published nudge (the instruction
            # again) or, with explain_problems, what went wrong first
            correction = prompts.agent_suffix
            if options.explain_problems and problems:
                correction = "\n".join(problems) + "\n" + prompts.agent_suffix.lstrip("\n")
            if not problems:
                step["problem"] = "no tool call and no <answer>"
        emit_event({f"{name}_step": step})  # stream_mode="custom": watch the loop turn by turn
        if keep_logprobs and answer is not None:
            metadata = getattr(reply, "response_metadata", None) or {}
            scored: ScoredStep = {**step, "logprobs": metadata.get("logprobs")}
            step = scored
        return {
            "started_at": started,
            "messages": new,
            "steps": [step],
            "answer": answer,
            "correction": correction,
            **({"stop_reason": ended} if ended else {}),
        }

    # Routers return edge labels (drawn on the workflow picture).
    def route(state: AgentLoopState) -> Literal["tool call", "malformed", "answer", "step limit"]:
        if state.get("error") or state.get("answer") is not None or state.get("stop_reason"):
            return "answer"
        if len(state.get("steps") or []) >= steps_allowed(state):
            return "step limit"
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tool call"
        return "malformed"

    def correct(state: AgentLoopState) -> dict[str, Any]:
        return {"messages": [HumanMessage(content=state["correction"])]}

    def after_tools(state: AgentLoopState) -> Literal["continue", "step limit"]:
        return "step limit" if len(state.get("steps") or []) >= steps_allowed(state) else "continue"

    def run_tool(
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
        return dehydrate(result, store) if isinstance(result, ToolMessage) else result

    async def arun_tool(
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
            result = await to_worker_thread(dehydrate, result, store)
        return result

    def finish(state: AgentLoopState) -> dict[str, Any]:
        steps = [dict(s) for s in state.get("steps") or []]
        attach_tool_results(steps, state.get("messages") or [])
        answer = state.get("answer")
        error = None
        if state.get("error"):
            reason = state.get("stop_reason") or "error"
        elif answer is not None:
            reason = "answered"
        elif stopped := state.get("stop_reason"):
            draft = state.get("draft") or {}
            answer = draft.get("text") or None
            reason = stopped + (", answered with the draft" if answer else "")
        elif options.on_step_limit == "error":
            reason = "step_limit"
            error = f"agent: no answer after {len(steps)} steps (step limit)"
        else:
            draft = state.get("draft") or {}
            answer = draft.get("text") or None
            reason = "step_limit, answered with the draft" if answer else "step_limit, no answer"
        elapsed = time.time() - (state.get("started_at") or time.time())
        return {
            **({"error": error} if error else {}),
            "answer": answer,
            "stop_reason": reason,
            "agent_messages": list(state.get("messages") or []),
            "agent_steps": steps,
            "timings": {"agent": elapsed},
        }

    graph = StateGraph(AgentLoopState, input_schema=AgentLoopInput, output_schema=AgentLoopOutput)
    graph.add_node("agent", node(agent))
    graph.add_node(
        "tools",
        ToolNode(
            tools,
            handle_tool_errors=_tool_error,
            wrap_tool_call=run_tool,
            awrap_tool_call=arun_tool,
        )
        if tools
        else node(_no_tools),
    )
    graph.add_node("correct", node(correct))
    graph.add_node("finish", node(finish))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges(
        "agent",
        router(route),
        {"tool call": "tools", "malformed": "correct", "answer": "finish", "step limit": "finish"},
    )
    graph.add_edge("correct", "agent")
    graph.add_conditional_edges(
        "tools", router(after_tools), {"continue": "agent", "step limit": "finish"}
    )
    graph.add_edge("finish", END)
    return graph


def agent_system_prompt(protocol: Protocol, prompts: Prompts, tools: Sequence[BaseTool]) -> str:
    """The agent's system prompt in its protocol (a ``Prompts.agent_system`` wins)."""
    if prompts.agent_system:
        return prompts.agent_system
    if protocol == "deepeyes":
        return tools_system_prompt([convert_to_openai_tool(t) for t in tools])
    if protocol == "thyme":
        if len(tools) != 1:
            names = sorted(t.name for t in tools) or "none"
            raise ValueError(f"the thyme protocol runs one code tool, got {names}")
        return THYME_SYSTEM_PROMPT
    return NATIVE_AGENT_SYSTEM_PROMPT


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


def _deadline_message(request: Any, exc: DeadlineExceeded) -> ToolMessage:
    return ToolMessage(
        content=f"Error: {exc}",
        tool_call_id=request.tool_call["id"],
        name=request.tool_call["name"],
        status="error",
    )


def _no_tools(state: AgentLoopState) -> dict[str, Any]:
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
