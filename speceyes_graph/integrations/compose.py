"""Putting SpecEyes inside other things: a chat graph and a tool for other agents.

- :func:`create_speceyes_chat_graph`: messages in, the answer appended as an ``AIMessage``
  out. The last human message is the query (:func:`~speceyes_graph.integrations.turns.chat_query`): its
  text is the question, an ``Options:`` line in it starts the multiple-choice options, and
  its image blocks (pasted images, URLs) are the images; a follow-up without an image asks
  about the latest image of the conversation. Works in LangGraph Studio's chat view and with any chat UI
  that speaks ``messages``. Images pasted into the chat are moved into the image store, so
  the thread's state holds references, not pixels. With ``stream_mode="messages"`` only the
  answer is streamed, with ``subgraphs=True`` too: the judge, the draft and the agent's
  turns are internal.
- :func:`speceyes_tool`: the graph as a LangChain tool for another agent (``create_agent``,
  a supervisor, a ``ToolNode``), returning a compact JSON result: answer, route, score.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, set_config_context
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from speceyes_tools.images import ImageStore, default_store

from .._compat import without_messages_stream
from ..effects import Blocking, Steps, Subgraph, arun_steps, node, run_steps
from ..graph.build import create_speceyes_graph
from ..messages import dehydrate
from ..state import AgentStep, Draft, PixelFreeGraph, Route, SpecEyesContext
from .turns import chat_query, pasted_images_kept, split_options

__all__ = [
    "SpecEyesChatState",
    "chat_query",
    "create_speceyes_chat_graph",
    "speceyes_tool",
    "split_options",
]


class SpecEyesChatState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    # the last turn's evidence (the answer itself is the last AIMessage)
    route: Route | None
    draft: Draft | None
    agent_steps: list[AgentStep]
    error: str | None


class _ChatInput(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class _ChatOutput(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: Route | None
    error: str | None


def _spelled_out(answer: str | None, options: list[str] | None) -> str | None:
    """A bare option letter as a chat reply names its option too: ``B`` -> ``B. green``."""
    letter = (answer or "").strip().rstrip(".)").lstrip("(")
    if options and len(letter) == 1 and "A" <= letter <= chr(64 + len(options)):
        return f"{letter}. {options[ord(letter) - 65]}"
    return answer


def _without_message_stream(config: RunnableConfig) -> RunnableConfig:
    """``config`` minus LangGraph's ``stream_mode="messages"`` handler, for the SpecEyes graph
    run inside the chat graph: with ``subgraphs=True`` that handler would stream every message
    the inner nodes write (the agent's turns, tool results). Tracing, user callbacks and the
    other stream modes (``updates``, ``custom``: the agent's steps) still see the inner run."""
    if config.get("callbacks") is None:
        return config
    return {**config, "callbacks": without_messages_stream(config["callbacks"])}


def _run_unstreamed(graph: Any, query: dict[str, Any], config: RunnableConfig) -> Steps:
    """Run the SpecEyes graph inside a caller (the chat graph's node, the tool) without the
    caller's messages stream (:func:`_without_message_stream`), set as the ambient config
    too: LangGraph merges the ambient callbacks back otherwise."""
    inner = _without_message_stream(config)
    with set_config_context(inner) as context:
        return (yield Subgraph(graph, query, inner, context=context))


def create_speceyes_chat_graph(
    *, store: ImageStore | None = None, **graph_kwargs: Any
) -> StateGraph[SpecEyesChatState, SpecEyesContext, _ChatInput, _ChatOutput]:
    """A chat front for SpecEyes (uncompiled; compile with your checkpointer).

    Takes the arguments of :func:`~speceyes_graph.create_speceyes_graph` (models, tools, gate,
    limits, ``on_error``...). Per-run context (``tau``, ``mode``...) is passed through.
    """
    store = store or default_store()
    speceyes = create_speceyes_graph(store=store, **graph_kwargs).compile(name="speceyes")

    def ask(state: SpecEyesChatState) -> Steps:
        messages = state.get("messages") or []
        last = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        if last is None:
            return {}
        try:
            # pasted pixels -> blob references, same message id (a blob store write: off the loop)
            kept = yield Blocking(dehydrate, (last, store))
        except Exception:
            return {}  # undecodable data: the query will fail on it with a clear error
        return {"messages": [kept]} if kept is not last else {}

    def answer(state: SpecEyesChatState, config: RunnableConfig) -> Steps:
        # the query is read from the checkpointed messages, so a run resumed here (on another
        # worker, after a crash) asks the same question
        query = chat_query(state.get("messages") or [])
        if query is None:
            reply = AIMessage(content="Ask a question about an image (attach the image).")
            return {
                "messages": [reply],
                "route": None,
                "draft": None,
                "agent_steps": [],
                "error": None,
            }
        # Without checkpoints of its own: the chat thread's checkpoints hold the turn (its
        # question is in the messages), and a resumed turn runs the query again from intake.
        # `speceyes` itself stays the subgraph that xray drawings and Studio show.
        run = speceyes.copy(update={"checkpointer": False})
        out = yield from _run_unstreamed(run, query, config)
        meta = {"speceyes": {"route": out.get("route"), "score": gate_score(out)}}
        text = _spelled_out(out.get("answer"), query["options"]) or (
            f"I could not answer: {out.get('error') or 'no answer'}"
        )
        return {
            "messages": [AIMessage(content=text, response_metadata=meta)],
            "route": out.get("route"),
            "draft": out.get("draft"),
            "agent_steps": out.get("agent_steps") or [],
            "error": out.get("error"),
        }

    graph = PixelFreeGraph(
        SpecEyesChatState,
        input_schema=_ChatInput,
        output_schema=_ChatOutput,
        context_schema=SpecEyesContext,
    )
    # pasted images go to the store as LangGraph takes the turn: its record of the input,
    # the saved writes and every checkpoint of `messages` hold blob:// blocks
    graph.keep_input = functools.partial(pasted_images_kept, store=store)
    graph.add_node("ask", node(ask))
    graph.add_node("answer", node(answer))
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "answer")
    graph.add_edge("answer", END)
    return graph


class _AskArgs(BaseModel):
    question: str = Field(description="The question about the image(s).")
    images: list[str] = Field(
        description="The images: data: URLs, https URLs, or paths/URLs the deployment allows."
    )
    options: list[str] | None = Field(
        default=None, description="Multiple-choice options, if the question has them."
    )


def gate_score(out: dict[str, Any]) -> float | None:
    """The score of the gate that decided: the small loop's answer on route
    ``speculative-tools`` (depth-D speculation), else the tool-free draft's."""
    key = "tool_draft" if out.get("route") == "speculative-tools" else "draft"
    return (out.get(key) or {}).get("score")


def speceyes_tool(
    graph: Any,
    *,
    name: str = "ask_about_images",
    description: str = (
        "Answer a question about one or more images. Small objects and fine details are "
        "handled by zooming in automatically."
    ),
) -> BaseTool:
    """The SpecEyes graph (built or compiled) as a tool returning ``{"answer", "route", "score"}``.

    A failed query becomes a tool error message for the calling model; the call never raises.
    """
    compiled = graph.compile() if not hasattr(graph, "invoke") else graph

    def compact(out: dict[str, Any]) -> str:
        if out.get("error"):
            raise ToolException(f"Error: {out['error']}")
        return json.dumps(
            {"answer": out.get("answer"), "route": out.get("route"), "score": gate_score(out)}
        )

    # The calling agent's messages stream gets the tool's result, not the inner run's
    # messages, as in the chat graph. The ambient config is the one to filter: it links the
    # run to the caller's streams and traces (a tool is handed a config without LangGraph's).

    def ask(question: str, images: list[str], options: list[str] | None = None) -> str:
        query = {"question": question, "images": images, "options": options}
        try:
            out = run_steps(_run_unstreamed(compiled, query, ensure_config()))
        except Exception as exc:  # e.g. a graph built with on_error="raise"
            raise ToolException(f"Error: {exc}") from None
        return compact(out)

    async def aask(question: str, images: list[str], options: list[str] | None = None) -> str:
        query = {"question": question, "images": images, "options": options}
        try:
            out = await arun_steps(_run_unstreamed(compiled, query, ensure_config()))
        except Exception as exc:
            raise ToolException(f"Error: {exc}") from None
        return compact(out)

    return StructuredTool.from_function(
        func=ask,
        coroutine=aask,
        name=name,
        description=description,
        args_schema=_AskArgs,
        handle_tool_error=True,
    )
