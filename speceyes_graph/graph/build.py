"""The SpecEyes workflow as a LangGraph state graph.

``intake -> judge -> speculate -> gate -> (END | agent_loop)``: ``intake`` checks the query
and starts the run clean; the large model judges whether tools are needed; tool-free queries
get a draft from the small model; the draft is kept when its answer separability clears tau;
everything else runs the agent. With depth-D speculation a query the judge sends to the
tools first runs the small model's own tool loop (``speculate_tools``;
:mod:`speceyes_graph.graph.tool_speculation`) and reaches the agent only when that answer fails
its gate.

This module is the wiring. The phases are :mod:`speceyes_graph.phases`, the nodes that run
them on a query :mod:`speceyes_graph.graph.nodes`, the agent fallback (the built-in loop, or any
agent that speaks messages) :mod:`speceyes_graph.graph.fallback`, and the options and their
defaults :mod:`speceyes_graph.graph.options`.

Every node has a synchronous and an asynchronous implementation from one body
(:mod:`speceyes_graph.effects`): under ``ainvoke``/``abatch``/``astream`` and in the LangGraph
server, model calls are awaited, parallel drafts are tasks and image work runs in worker
threads, so a query in flight holds no thread; ``invoke``/``batch`` give the same results.

Failures are data: every node catches its own failures and records them in ``error``, so
one broken image, hung model or malformed reply fails that query only (or, with
``on_error="raise"``, fails that run, as a served graph wants). Every model call and the
query as a whole have deadlines. Model calls are tagged ``nostream``: with
``stream_mode="messages"`` a caller sees answers, not the judge's "yes" or the draft.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langgraph.graph import END, START, StateGraph

from speceyes_tools.images import ImageStore, ResizeSpec

from ..agents.loop import LoopOptions
from ..effects import node, router
from ..gate.online import OnlineGate
from ..gate.online_steps import OnlineSteps
from ..gate.separability import GateConfig
from ..phases import score_draft
from ..prompts import Prompts
from ..protocol import parse_judge
from ..settings import Limits, OnError
from ..state import (
    Mode,
    PixelFreeGraph,
    RunInput,
    SpecEyesContext,
    SpecEyesInput,
    SpecEyesOutput,
    SpecEyesState,
    pixel_free,
    pixel_free_input,
)
from .fallback import AgentFallback, agent_loop_node
from .nodes import (
    NodeKit,
    SpecEyesError,
    after_gate,
    after_intake,
    after_judge,
    gate_node,
    intake_node,
    judge_node,
    speculate_node,
)
from .options import (
    THYME_TAU,
    Speculation,
    SpeculationOptions,
    ToolsSpec,
    resolve_setup,
)
from .parallel_drafts import StartedDrafts
from .specreason import specreason_node
from .tool_speculation import after_tool_gate, small_loop, speculate_tools_node

__all__ = [
    "THYME_TAU",
    "SpecEyesError",
    "Speculation",
    "SpeculationOptions",
    "create_speceyes_graph",
    "parse_judge",
    "score_draft",
]

_FIRST_NODE = {
    "agent": "agent_loop",
    "small": "speculate",
    "speceyes": "judge",
    "specreason": "specreason",
}


def create_speceyes_graph(
    *,
    speculator: BaseChatModel | None = None,
    agent: BaseChatModel | Runnable[Any, Any] | None = None,
    judge: BaseChatModel | str | None = None,
    tools: ToolsSpec | None = "deepeyes",
    mode: Mode = "speceyes",
    gate: GateConfig | OnlineGate | str | Path | None = None,
    speculation: SpeculationOptions | Speculation | None = None,
    loop: LoopOptions | None = None,
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    limits: Limits | None = None,
    store: ImageStore | None = None,
    on_error: OnError = "record",
) -> StateGraph[SpecEyesState, SpecEyesContext, SpecEyesInput, SpecEyesOutput]:
    """Build the (uncompiled) SpecEyes graph; call ``.compile()`` with your checkpointer.

    Args:
        speculator: the small model; its replies must carry OpenAI-format top-K log-probs in
            ``response_metadata["logprobs"]`` (``ChatOpenAI(logprobs=True, top_logprobs=K)``
            or ``ChatTransformersVLM(top_logprobs=K)``).
        agent: the fallback: a tool-calling chat model, which runs the built-in agent loop
            with ``tools``; or any agent that speaks messages (a ``create_agent(...)``
            result, a compiled ``StateGraph`` over ``messages``, a Runnable), which is sent
            the query as one human message and whose last message is the answer
            (:mod:`speceyes_graph.graph.fallback`).
        judge: the model of phase I: a chat model, ``"agent"`` (the default: the agent's
            own model, the paper's setup) or ``"speculator"`` (the paper's ablation). An
            agent that is not a chat model cannot judge: give the large model here.
        tools: the built-in loop's tools: a built-in toolset name (``deepeyes``,
            ``vision``), a TOML/YAML file, a :class:`~speceyes_graph.agents.toolsets.Toolset`, or a
            list of LangChain tools.
        mode: the default mode: ``speceyes``; ``agent`` (baseline, every query to the
            agent); ``small`` (draft only, never falls back; the gate score is still
            recorded); ``specreason``. A run may pick another mode (context ``mode``) if the
            graph has its models.
        gate: phase III: a :class:`~speceyes_graph.gate.separability.GateConfig` (defaults: tau
            0.98, or Thyme's 0.95; K 64, ``min``), the path of a gate file from ``speceyes
            calibrate``, or an :class:`~speceyes_graph.gate.online.OnlineGate`, which moves
            tau with the labels production gives so the risk stays at its target. Per run:
            context ``tau``, ``k``, ``aggregation``.
        speculation: phases I and II and depth-D speculation:
            :class:`~speceyes_graph.graph.options.SpeculationOptions` (when the draft starts,
            generation lengths, the small model's frame, the small model's own tool loop),
            or just when the draft starts: ``"after_judge"`` (the paper's funnel) or
            ``"parallel"``.
        loop: phase IV, the built-in agent loop: :class:`~speceyes_graph.agents.loop.LoopOptions`
            (protocol, ``max_steps``, the text protocol's options).
        prompts: the phases' and the loop's prompts (default: the published ones; Thyme's
            for the Thyme protocol).
        resize: how the large model's processor resizes images (the frame of its boxes);
            by default the agent model's ``resize_spec`` (``ChatTransformersVLM`` has one),
            else Qwen2.5-VL's.
        limits: deadlines, question and image counts, ceilings for per-run overrides.
        store: the image store: which image references are accepted (its ``policy``), where
            crops and inputs are kept (its ``blobs``), decode cache and memory budget.
        on_error: ``record`` (a failed query returns with ``error`` set: right for batches)
            or ``raise`` (the run fails with :class:`SpecEyesError`: right for servers).
    """
    setup = resolve_setup(
        speculator=speculator, agent=agent, judge=judge, tools=tools, mode=mode, gate=gate,
        speculation=speculation, loop=loop, prompts=prompts, resize=resize, limits=limits,
        store=store, on_error=on_error,
    )  # fmt: skip
    kit, drafts = NodeKit(setup), StartedDrafts()
    fallback = AgentFallback(kit) if setup.has_fallback else None
    online = (
        OnlineSteps(setup.online, fallback.shadow_answer) if setup.online and fallback else None
    )

    graph = PixelFreeGraph(
        SpecEyesState,
        input_schema=SpecEyesInput,
        output_schema=SpecEyesOutput,
        context_schema=SpecEyesContext,
    )
    # data: URLs are kept in the image store as LangGraph takes the input, and as anything
    # else writes them (update_state): checkpoints and saved writes hold their blob:// keys
    graph.keep_input = functools.partial(pixel_free_input, store=setup.store)
    graph.channels["images"] = RunInput(list, keep=functools.partial(pixel_free, store=setup.store))

    # Routers return edge labels (drawn on the workflow picture); each path map names the
    # node a label leads to.
    graph.add_node("intake", node(intake_node(kit, online)))
    graph.add_edge(START, "intake")
    first: dict[Hashable, str] = {m: _FIRST_NODE[m] for m in sorted(setup.available)}
    graph.add_conditional_edges("intake", router(after_intake), {**first, "invalid": END})
    if "speceyes" in setup.available:
        graph.add_node("judge", node(judge_node(kit, drafts, online)))
        judged: dict[Hashable, str] = {"no": "speculate", "yes": "agent_loop", "failed": END}
        judged["yes, speculate with tools"] = "speculate_tools"
        graph.add_conditional_edges("judge", router(after_judge), judged)
        tagged = setup.protocol in ("deepeyes", "thyme")  # answers in <answer> tags: gate those
        graph.add_node(
            "speculate_tools", node(speculate_tools_node(small_loop(setup), setup.gate, tagged))
        )
        graph.add_conditional_edges(
            "speculate_tools", router(after_tool_gate), {"accept": END, "reject": "agent_loop"}
        )
    if setup.speculator is not None:
        graph.add_node("speculate", node(speculate_node(kit, drafts, online)))
        graph.add_node("gate", node(gate_node(online)))
        graph.add_edge("speculate", "gate")
        gated: dict[Hashable, str] = {"accept": END, "failed": END}
        if fallback is not None:
            gated["reject"] = "agent_loop"
        graph.add_conditional_edges("gate", router(after_gate), gated)
    if fallback is not None:
        graph.add_node("agent_loop", node(agent_loop_node(kit, fallback, online)))
        graph.add_edge("agent_loop", END)
    if "specreason" in setup.available:
        graph.add_node("specreason", node(specreason_node(kit)))
        graph.add_edge("specreason", END)
    return graph
