"""Phase IV: the large model's tool loop, as a LangGraph subgraph named ``agent_loop``.

The standard pattern: a model node, a ``ToolNode``, and an edge back, bounded by
``max_steps`` model turns. Two protocols are spoken (see :mod:`.messages`): DeepEyes text
(``<tool_call>`` JSON in plain text, parsed here defensively) and native tool calling.
Everything a model writes is untrusted: malformed calls and unknown tools are recorded and
answered with a corrective message; tool failures go back to the model as the tool's
answer; a model exception fails only this query, recorded in ``error``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from typing_extensions import TypedDict

from speceyes_tools.images import ImageStore, ResizeSpec

from .messages import Protocol, to_wire, user_message
from .prompts import NATIVE_AGENT_SYSTEM_PROMPT, Prompts, format_question, tools_system_prompt
from .protocol import extract_answer, message_text, parse_deepeyes
from .state import AgentStep, Draft, merge_timings

__all__ = ["AgentLoopState", "create_agent_loop", "DEFAULT_MAX_STEPS"]

DEFAULT_MAX_STEPS = 6


class AgentLoopInput(TypedDict, total=False):
    question: str
    images: list[str]
    options: list[str] | None
    draft: Draft | None


class AgentLoopOutput(TypedDict, total=False):
    answer: str | None
    agent_messages: list[AnyMessage]
    agent_steps: list[AgentStep]
    stop_reason: str | None
    error: str | None
    timings: Annotated[dict[str, float], merge_timings]


class AgentLoopState(AgentLoopInput, AgentLoopOutput, total=False):
    messages: Annotated[list[AnyMessage], add_messages]  # private working transcript
    steps: Annotated[list[AgentStep], operator.add]  # private: one per model turn
    started_at: float


def _tool_error(exc: Exception) -> str:
    return f"Error: {type(exc).__name__}: {exc}"


def create_agent_loop(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    protocol: Protocol = "deepeyes",
    max_steps: int = DEFAULT_MAX_STEPS,
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
) -> StateGraph:
    """The uncompiled ``agent_loop`` subgraph.

    ``max_steps`` bounds model turns (tool rounds included). When it is reached the query
    ends with the best answer available: the loop's last ``<answer>``, else the rejected
    draft if there was one; ``stop_reason`` says which.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    prompts = prompts or Prompts()
    tools = list(tools)
    tool_names = {t.name for t in tools}
    if protocol == "deepeyes":
        system = prompts.agent_system or tools_system_prompt(
            [convert_to_openai_tool(t) for t in tools]
        )
        bound = model
    else:
        system = prompts.agent_system or NATIVE_AGENT_SYSTEM_PROMPT
        bound = model.bind_tools(tools) if tools else model

    def first_messages(state: AgentLoopState) -> list[AnyMessage]:
        text = format_question(state.get("question"), state.get("options"))
        if protocol == "deepeyes":
            text += prompts.agent_suffix
        return [
            SystemMessage(content=system),
            user_message(state.get("images"), text, resize, store),
        ]

    def agent(state: AgentLoopState) -> dict[str, Any]:
        started = state.get("started_at") or time.time()
        history = list(state.get("messages") or [])
        new: list[AnyMessage] = [] if history else first_messages(state)
        step_no = len(state.get("steps") or []) + 1
        try:
            t0 = time.perf_counter()
            reply = bound.invoke(
                to_wire(history + new, protocol, prompts.tool_response_instruction)
            )
            latency = time.perf_counter() - t0
        except Exception as exc:  # the model failed: this query fails, the batch goes on
            return {
                "started_at": started,
                "messages": new,
                "error": f"agent model: {type(exc).__name__}: {exc}",
                "stop_reason": "error",
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
        elif protocol == "deepeyes" or "<tool_call>" in text:
            parsed = parse_deepeyes(text, tool_names)
            calls, problems, answer = parsed.tool_calls, parsed.problems, parsed.answer
        else:
            calls, problems = [], []
            answer = extract_answer(text) or (text.strip() or None)
        ai = AIMessage(content=text, tool_calls=calls, id=getattr(reply, "id", None))
        new.append(ai)
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
        _emit({"agent_step": step})  # stream_mode="custom": watch the loop turn by turn
        if not calls and answer is None:
            # nothing to do: tell the model what went wrong, in the protocol's words
            correction = "\n".join(problems) if problems else ""
            new.append(
                HumanMessage(
                    content=(correction + "\n" if correction else "")
                    + prompts.agent_suffix.lstrip("\n")
                )
            )
            if not problems:
                step["problem"] = "no tool call and no <answer>"
        return {"started_at": started, "messages": new, "steps": [step], "answer": answer}

    def route(state: AgentLoopState) -> Literal["tools", "agent", "finish"]:
        if state.get("error") or state.get("answer") is not None:
            return "finish"
        if len(state.get("steps") or []) >= max_steps:
            return "finish"
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return "tools"
        return "agent"  # a corrective message was appended

    def finish(state: AgentLoopState) -> dict[str, Any]:
        steps = [dict(s) for s in state.get("steps") or []]
        _attach_tool_results(steps, state.get("messages") or [])
        answer = state.get("answer")
        if state.get("error"):
            reason = "error"
        elif answer is not None:
            reason = "answered"
        else:
            draft = state.get("draft") or {}
            answer = draft.get("text") or None
            reason = "step_limit, answered with the draft" if answer else "step_limit, no answer"
        elapsed = time.time() - (state.get("started_at") or time.time())
        return {
            "answer": answer,
            "stop_reason": reason,
            "agent_messages": list(state.get("messages") or []),
            "agent_steps": steps,
            "timings": {"agent": elapsed},
        }

    graph = StateGraph(AgentLoopState, input_schema=AgentLoopInput, output_schema=AgentLoopOutput)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=_tool_error) if tools else _no_tools)
    graph.add_node("finish", finish)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", "agent", "finish"])
    graph.add_conditional_edges("tools", _after_tools(max_steps), ["agent", "finish"])
    graph.add_edge("finish", END)
    return graph


def _emit(event: dict[str, Any]) -> None:
    try:
        get_stream_writer()(event)
    except RuntimeError:  # called outside a graph run (no stream context)
        pass


def _after_tools(max_steps: int):
    def after_tools(state: AgentLoopState) -> Literal["agent", "finish"]:
        return "finish" if len(state.get("steps") or []) >= max_steps else "agent"

    return after_tools


def _no_tools(state: AgentLoopState) -> dict[str, Any]:
    last = state["messages"][-1]
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


def _attach_tool_results(steps: list[dict], messages: Sequence[AnyMessage]) -> None:
    """Copy each tool result's trace (box after clamping, latency, error) into its step."""
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    for step in steps:
        for call in step.get("tool_calls", []):
            tm = results.get(call.get("id"))
            if tm is None:
                continue
            artifact = tm.artifact if isinstance(tm.artifact, dict) else {}
            call["box"] = artifact.get("box")
            call["notes"] = artifact.get("notes")
            call["latency_s"] = artifact.get("latency_s")
            call["error"] = (
                message_text(tm)
                if tm.status == "error" or message_text(tm).startswith("Error")
                else None
            )
