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

This module is the loop's surface and wiring; its steps and state are in :mod:`.steps`.

The stored transcript holds no pixels and no system prompt: images are ``blob://``
references (tool results are moved into the image store as they arrive), and the system
prompt, the same for every query, is added only when the model is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.constants import TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

from speceyes_tools.images import ImageStore, ResizeSpec, default_store

from ..effects import node, router
from ..messages import Protocol
from ..prompts import (
    NATIVE_AGENT_SYSTEM_PROMPT,
    THYME_STOP,
    THYME_SYSTEM_PROMPT,
    Prompts,
    tools_system_prompt,
)
from .steps import (
    AgentLoopInput,
    AgentLoopOutput,
    AgentLoopState,
    LoopOptions,
    LoopSteps,
    attach_tool_results,
    emit_event,
    first_user_message,
    no_tools,
    tool_error,
    tool_trace,
)

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
    # re-exported from .steps, where the loop's state and steps are (imported from here)
    "AgentLoopInput",
    "AgentLoopOutput",
    "emit_event",
]

DEFAULT_MAX_STEPS = 6
THYME_MAX_STEPS = 5  # the published harness's MAX_ITERATIONS


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
    system = agent_system_prompt(protocol, prompts, tools)
    steps = LoopSteps(
        model=model,
        bound=_turn_model(model, tools, protocol, name),
        protocol=protocol,
        prompts=prompts,
        options=options,
        store=store,
        resize=resize,
        system=system,
        tool_names=frozenset(t.name for t in tools),
        max_steps=max_steps,
        turn_kwargs=_turn_kwargs(protocol, options.stop, max_tokens),
        keep_logprobs=keep_logprobs,
        name=name,
    )
    return _wire(steps, tools)


def _turn_model(
    model: BaseChatModel, tools: list[BaseTool], protocol: Protocol, name: str
) -> Runnable[Any, Any]:
    """The model a turn calls: tools bound for native calls; kept out of the graph's token
    stream (the loop streams whole steps) and traced as ``{name}_model``."""
    bound = model.bind_tools(tools) if protocol == "native" and tools else model
    return bound.with_config(tags=[TAG_NOSTREAM], run_name=f"{name}_model")


def _turn_kwargs(
    protocol: Protocol, stop: tuple[str, ...], max_tokens: int | None
) -> dict[str, Any]:
    """Each turn's call arguments. Text protocols stop where the loop takes over (a tool
    call, an answer); Thyme's own stop strings replace the DeepEyes default unless other
    stops were asked for."""
    if protocol == "thyme" and stop == LoopOptions.stop:
        stop = THYME_STOP
    kwargs: dict[str, Any] = (
        {"stop": list(stop)} if protocol in ("deepeyes", "thyme") and stop else {}
    )
    if max_tokens:
        kwargs["max_tokens"] = max_tokens
    return kwargs


def _wire(
    steps: LoopSteps, tools: list[BaseTool]
) -> StateGraph[AgentLoopState, None, AgentLoopInput, AgentLoopOutput]:
    """The graph: a model turn, then a tool round or a correction back to it, until an
    answer, an end or the step limit sends it to ``finish``."""
    graph = StateGraph(AgentLoopState, input_schema=AgentLoopInput, output_schema=AgentLoopOutput)
    graph.add_node("agent", node(steps.agent))
    graph.add_node(
        "tools",
        ToolNode(
            tools,
            handle_tool_errors=tool_error,
            wrap_tool_call=steps.run_tool,
            awrap_tool_call=steps.arun_tool,
        )
        if tools
        else node(no_tools),
    )
    graph.add_node("correct", node(steps.correct))
    graph.add_node("finish", node(steps.finish))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges(
        "agent",
        router(steps.route),
        {"tool call": "tools", "malformed": "correct", "answer": "finish", "step limit": "finish"},
    )
    graph.add_edge("correct", "agent")
    graph.add_conditional_edges(
        "tools", router(steps.after_tools), {"continue": "agent", "step limit": "finish"}
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
