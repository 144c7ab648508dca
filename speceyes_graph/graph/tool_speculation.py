"""Depth-D speculation: the small model runs the tool loop itself before the large agent does.

The paper speculates at depth 0: the small model answers tool-free, so every query the judge
sends to the tools pays the full agent loop, however easy the one zoom it needs. With
``speculation_depth=D`` such a query first goes through the *small* model's tool loop: the
same loop, toolset and protocol as the large agent
(:func:`~speceyes_graph.agents.loop.create_agent_loop`), its own prompts and image frame, at
most D tool steps (D + 1 model turns: the last must answer). Its answer is kept when the
separability of the answer's own tokens clears ``tau_depth``; otherwise (rejected, no
answer within D steps, a failure) the query goes to the large agent exactly as at depth 0,
which never sees the small loop.

Why the answer's tokens only: an agent turn is mostly reasoning and tool syntax that the
model writes with great confidence; its minimum over every token would judge the think text.

The expected cost per query, with judge cost c_J, draft cost c_S, the small loop's cost c_S^D
and the agent's L_agent (beta: share judged tool-free, alpha: their drafts accepted,
alpha_D: tool-needing queries accepted at depth D)::

    E[L] = c_J + beta c_S + (1 - beta) c_S^D + (1 - beta alpha - (1 - beta) alpha_D) L_agent

Depth pays when the agent time it saves, (1 - beta) alpha_D L_agent, exceeds what the small
loop costs on every tool-needing query, (1 - beta) c_S^D: when alpha_D > c_S^D / L_agent.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from langgraph.graph.state import CompiledStateGraph

from speceyes_tools.deadlines import check_deadline, deadline_scope

from ..agents.loop import create_agent_loop, recursion_limit
from ..effects import Steps, Subgraph
from ..gate.separability import GateConfig, answer_span
from ..settings import RunSettings
from ..state import AgentStep, Draft, SpecEyesState
from .options import GraphSetup

__all__ = [
    "after_tool_gate",
    "small_loop",
    "small_loop_input",
    "speculate_tools_node",
    "tool_draft",
]


def small_loop(setup: GraphSetup) -> CompiledStateGraph:
    """The small model's tool loop: the agent loop's code with the speculator in it, its
    tools in its own frame, its prompts and turn length, no answer at the step limit (a
    rejection), and the answering turn's log-probs kept for the gate."""
    options = setup.speculation
    assert setup.speculator is not None  # a graph that speculates has one
    return create_agent_loop(
        setup.speculator,
        setup.small_tools,
        protocol=setup.protocol,
        max_steps=setup.limits.max_speculation_depth + 1,
        prompts=options.prompts or setup.prompts,
        resize=options.resize,
        store=setup.store,
        options=dataclasses.replace(setup.loop, on_step_limit="error"),
        keep_logprobs=True,
        name="small_agent",
        max_tokens=options.step_tokens,
    ).compile(name="small_loop")


def speculate_tools_node(
    small_loop: CompiledStateGraph, gate: GateConfig, tagged: bool
) -> Callable[[SpecEyesState], Steps]:
    """The ``speculate_tools`` node: the small model's loop for this run's depth, gated.

    ``small_loop`` is the agent loop built for the small model (its tools, frame, prompts,
    ``keep_logprobs``; no answer at the step limit); ``gate`` the graph's gate, with this
    run's overrides applied per query; ``tagged``: the protocol writes ``<answer>`` tags.
    """

    def speculate_tools(state: SpecEyesState) -> Steps:
        t0 = time.perf_counter()
        settings = state["settings"]
        depth = settings["speculation_depth"]
        try:
            with deadline_scope(state.get("deadline")):
                check_deadline("small tool loop")
            out = yield Subgraph(
                small_loop.copy(update={"checkpointer": False}),  # as the agent loop runs
                small_loop_input(state["query"], state, depth),
                {"recursion_limit": recursion_limit(depth + 1)},
            )
        except Exception as exc:  # the large agent still answers: record, do not fail
            out = {"error": f"{type(exc).__name__}: {exc}", "stop_reason": "error"}
        elapsed = time.perf_counter() - t0
        gate_config = RunSettings(**settings).gate(gate).after_tools()
        draft = tool_draft(out, depth, gate_config, tagged, elapsed)
        update: dict[str, Any] = {"tool_draft": draft, "timings": {"speculate_tools": elapsed}}
        if draft["accepted"]:
            update.update(answer=draft["text"], route="speculative-tools")
        return update

    return speculate_tools


def after_tool_gate(state: SpecEyesState) -> str:
    return "accept" if state.get("route") == "speculative-tools" else "reject"


def small_loop_input(
    query: Mapping[str, Any], state: Mapping[str, Any], depth: int
) -> dict[str, Any]:
    """The small loop's input: the query, D + 1 model turns, the query's deadlines."""
    settings = state["settings"]
    return {
        "question": query["question"],
        "images": query["images"],
        "options": query["options"],
        "draft": None,  # no draft to fall back on: no answer within D steps is a rejection
        "max_steps": depth + 1,
        "deadline": state.get("deadline"),
        "model_timeout_s": settings["model_timeout_s"],
        "tool_timeout_s": settings["tool_timeout_s"],
    }


def tool_draft(
    out: dict[str, Any], depth: int, gate: GateConfig, tagged: bool, latency_s: float
) -> Draft:
    """The small loop's result as a gated draft (``accepted`` says whether it answers).

    ``out`` is the loop's output with ``keep_logprobs`` on; ``tagged``: the protocol writes
    its answer in ``<answer>`` tags (DeepEyes, Thyme), so only those tokens are scored.
    """
    steps = [dict(s) for s in out.get("agent_steps") or []]
    logprobs = steps[-1].get("logprobs") if steps else None
    for step in steps:
        step.pop("logprobs", None)  # the score's evidence is kept below, once
    draft: Draft = {
        "text": (out.get("answer") or "").strip(),
        "depth": depth,
        "steps": cast(list[AgentStep], steps),  # the loop's steps, less their logprobs
        "stop_reason": out.get("stop_reason"),
        "latency_s": latency_s,
        "accepted": False,
    }
    if out.get("error"):
        draft["error"] = "small loop: " + str(out["error"]).removeprefix("agent: ")
    elif out.get("stop_reason") != "answered" or not draft["text"]:
        draft["error"] = f"small loop: no answer ({out.get('stop_reason') or 'empty'})"
    else:
        draft.update(gate.decide(answer_span(logprobs) if tagged and logprobs else logprobs))
    return draft
