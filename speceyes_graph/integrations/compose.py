"""Putting SpecEyes inside other things: the graph run inside a caller, and as a tool.

- :func:`run_unstreamed`: the SpecEyes graph run inside a caller's node or tool, its inner
  messages kept off the caller's messages stream (the chat front,
  :mod:`speceyes_graph.integrations.chat`, shows the agent's steps its own way);
- :func:`speceyes_tool`: the graph as a LangChain tool for another agent (``create_agent``,
  a supervisor, a ``ToolNode``), returning a compact JSON result: answer, route, score.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, set_config_context
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from .._compat import without_messages_stream, without_values_stream
from ..effects import Steps, Subgraph, arun_steps, run_steps

__all__ = ["gate_score", "run_unstreamed", "speceyes_tool"]


def _without_message_stream(config: RunnableConfig) -> RunnableConfig:
    """``config`` minus LangGraph's ``stream_mode="messages"`` handler and the caller's
    ``values`` stream, for the SpecEyes graph run inside the chat graph: with
    ``subgraphs=True`` the handler would stream every message the inner nodes write (the
    agent's turns, tool results), and chat UIs take a subgraph's values for the thread's
    (:func:`~speceyes_graph._compat.without_values_stream`). Tracing, user callbacks and the
    other stream modes (``updates``, ``custom``: the agent's steps) still see the inner run."""
    config = without_values_stream(config)
    if config.get("callbacks") is None:
        return config
    return {**config, "callbacks": without_messages_stream(config["callbacks"])}


def run_unstreamed(graph: Any, query: dict[str, Any], config: RunnableConfig) -> Steps:
    """Run the SpecEyes graph inside a caller (the chat graph's node, the tool) without the
    caller's messages stream (:func:`_without_message_stream`), set as the ambient config
    too: LangGraph merges the ambient callbacks back otherwise."""
    inner = _without_message_stream(config)
    with set_config_context(inner) as context:
        return (yield Subgraph(graph, query, inner, context=context))


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
            out = run_steps(run_unstreamed(compiled, query, ensure_config()))
        except Exception as exc:  # e.g. a graph built with on_error="raise"
            raise ToolException(f"Error: {exc}") from None
        return compact(out)

    async def aask(question: str, images: list[str], options: list[str] | None = None) -> str:
        query = {"question": question, "images": images, "options": options}
        try:
            out = await arun_steps(run_unstreamed(compiled, query, ensure_config()))
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
