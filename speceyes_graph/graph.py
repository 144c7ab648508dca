"""The SpecEyes workflow as a LangGraph state graph.

``judge -> speculate -> gate -> (END | agent_loop)``: the large model judges whether tools
are needed; tool-free queries get a draft from the small model; the draft is kept when its
answer separability clears tau; everything else runs the agent loop. Under
``graph.batch()`` each query runs its own path concurrently, so (with a batching backend)
model calls of many queries coalesce while slow tool loops proceed on their own.

Every node catches its own failures and records them in ``error``: one broken image or
model error fails that query only.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph

from speceyes_tools.images import ImageStore, ResizeSpec

from .agent import DEFAULT_MAX_STEPS, create_agent_loop
from .messages import Protocol, user_message
from .prompts import Prompts, format_question
from .protocol import message_text
from .separability import GateConfig, SeparabilityError
from .state import Draft, Mode, SpecEyesInput, SpecEyesOutput, SpecEyesState
from .toolsets import Toolset, build_tools, load_toolset

__all__ = ["create_speceyes_graph", "parse_judge"]

log = logging.getLogger(__name__)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)


def parse_judge(text: str) -> bool:
    """True (tool-free) iff the judge's answer, lower-cased, starts with "no".

    This is the published rule; anything else, including an empty or garbled answer,
    routes to the agent loop (the safe default: it costs time, never accuracy). A leading
    ``<think>`` block is skipped.
    """
    visible = _THINK.sub("", text or "").strip().strip("\"'*`").lower()
    return visible.startswith("no")


def create_speceyes_graph(
    *,
    judge: BaseChatModel | None = None,
    speculator: BaseChatModel | None = None,
    agent: BaseChatModel | None = None,
    tools: str | Path | Toolset | Sequence[BaseTool] | None = "deepeyes",
    mode: Mode = "speceyes",
    gate: GateConfig | None = None,
    speculator_as_judge: bool = False,
    max_agent_steps: int = DEFAULT_MAX_STEPS,
    judge_max_tokens: int | None = 10,
    draft_max_tokens: int | None = 20,
    protocol: Protocol | Literal["auto"] = "auto",
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    speculator_resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
) -> StateGraph:
    """Build the (uncompiled) SpecEyes graph; call ``.compile()`` with your checkpointer.

    Args:
        judge: the large model for phase I; defaults to ``agent`` (the paper's setup).
        speculator: the small model; its replies must carry OpenAI-format top-K log-probs in
            ``response_metadata["logprobs"]`` (``ChatOpenAI(logprobs=True, top_logprobs=K)``
            or ``ChatTransformersVLM(top_logprobs=K)``).
        agent: the large tool-calling model for the fallback loop.
        tools: a built-in toolset name (``deepeyes``, ``vision``), a TOML/YAML file, a
            :class:`Toolset`, or a list of LangChain tools.
        mode: ``speceyes``; ``agent`` (baseline, every query to the loop); ``small`` (draft
            only, never falls back; the gate score is still recorded).
        gate: threshold, K, aggregation (defaults: tau 0.98, K 64, ``min``).
        speculator_as_judge: use the small model as the judge (the paper's ablation).
        protocol: ``deepeyes`` (tool calls as text), ``native`` (structured tool calls), or
            ``auto``: ``deepeyes`` when the toolset is exactly ``image_zoom_in_tool``.
        judge_max_tokens, draft_max_tokens: generation lengths of phases I and II (the
            published 10 and 20), passed to the models as ``max_tokens``; None leaves the
            model's own setting.
        resize: how the large model's processor resizes images (the frame of its boxes);
            by default taken from the agent model when it exposes ``resize_spec``
            (``ChatTransformersVLM`` does), else Qwen2.5-VL's defaults.
        speculator_resize: the same for the small model.
    """
    gate = gate or GateConfig()
    prompts = prompts or Prompts()
    resize = resize or getattr(agent, "resize_spec", None) or ResizeSpec()
    speculator_resize = speculator_resize or getattr(speculator, "resize_spec", None) or resize
    judge_kwargs = {"max_tokens": judge_max_tokens} if judge_max_tokens else {}
    draft_kwargs = {"max_tokens": draft_max_tokens} if draft_max_tokens else {}
    if mode not in ("speceyes", "agent", "small"):
        raise ValueError(f"unknown mode {mode!r}; use 'speceyes', 'agent' or 'small'")
    needs_agent = mode in ("speceyes", "agent")
    needs_speculator = mode in ("speceyes", "small")
    if needs_agent and agent is None:
        raise ValueError(f"mode {mode!r} needs an agent model (agent=...)")
    if needs_speculator and speculator is None:
        raise ValueError(f"mode {mode!r} needs a speculator model (speculator=...)")
    judge_model = speculator if speculator_as_judge else (judge or agent)

    graph = StateGraph(SpecEyesState, input_schema=SpecEyesInput, output_schema=SpecEyesOutput)

    # --- phase I ------------------------------------------------------------------------------
    def judge_node(state: SpecEyesState) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            text = (
                format_question(state.get("question"), state.get("options")) + prompts.judge_suffix
            )
            judge_resize = speculator_resize if speculator_as_judge else resize
            reply = judge_model.invoke(
                [
                    SystemMessage(content=prompts.judge_system),
                    user_message(state.get("images"), text, judge_resize, store),
                ],
                **judge_kwargs,
            )
            output = message_text(reply).strip()
        except Exception as exc:
            return _failed("judge", exc, t0)
        tool_free = parse_judge(output)
        return {
            "judge_output": output,
            "tool_free": tool_free,
            "route": None if tool_free else "judged-agentic",
            "timings": {"judge": time.perf_counter() - t0},
        }

    # --- phase II -----------------------------------------------------------------------------
    def speculate_node(state: SpecEyesState) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            text = (
                format_question(state.get("question"), state.get("options"))
                + prompts.speculator_suffix
            )
            reply = speculator.invoke(
                [
                    SystemMessage(content=prompts.speculator_system),
                    user_message(state.get("images"), text, speculator_resize, store),
                ],
                **draft_kwargs,
            )
        except Exception as exc:
            if mode == "small":
                return _failed("speculator", exc, t0)
            draft: Draft = {
                "text": "",
                "accepted": False,
                "error": f"speculator: {type(exc).__name__}: {exc}",
            }
            return {"draft": draft, "timings": {"speculate": time.perf_counter() - t0}}
        draft = {"text": message_text(reply).strip(), **score_draft(reply, gate)}
        return {"draft": draft, "timings": {"speculate": time.perf_counter() - t0}}

    # --- phase III ----------------------------------------------------------------------------
    def gate_node(state: SpecEyesState) -> dict[str, Any]:
        draft = state.get("draft") or {}
        if mode == "small":
            return {"answer": draft.get("text"), "route": "draft-only"}
        if draft.get("accepted"):
            return {"answer": draft.get("text"), "route": "speculative"}
        return {"route": "rejected-agentic"}

    def after_judge(state: SpecEyesState) -> Literal["speculate", "agent_loop", "__end__"]:
        if state.get("error"):
            return END
        return "speculate" if state.get("tool_free") else "agent_loop"

    def after_gate(state: SpecEyesState) -> Literal["agent_loop", "__end__"]:
        return "agent_loop" if state.get("route") == "rejected-agentic" else END

    if needs_agent:
        toolset = tools if isinstance(tools, Sequence) and not isinstance(tools, str) else None
        tool_list = (
            list(toolset)
            if toolset is not None
            else build_tools(load_toolset(tools), resize=resize, store=store)
        )
        chosen = protocol
        if chosen == "auto":
            chosen = (
                "deepeyes" if [t.name for t in tool_list] == ["image_zoom_in_tool"] else "native"
            )
        loop = create_agent_loop(
            agent,
            tool_list,
            protocol=chosen,
            max_steps=max_agent_steps,
            prompts=prompts,
            resize=resize,
            store=store,
        ).compile(name="agent_loop")
        graph.add_node("agent_loop", loop)
        graph.add_edge("agent_loop", END)

    if mode == "agent":
        graph.add_node("baseline", lambda state: {"route": "agent-only"})
        graph.add_edge(START, "baseline")
        graph.add_edge("baseline", "agent_loop")
        return graph

    graph.add_node("speculate", speculate_node)
    graph.add_node("gate", gate_node)
    graph.add_edge("speculate", "gate")
    if mode == "small":
        graph.add_edge(START, "speculate")
        graph.add_edge("gate", END)
        return graph
    graph.add_node("judge", judge_node)
    graph.add_edge(START, "judge")
    graph.add_conditional_edges("judge", after_judge, ["speculate", "agent_loop", END])
    graph.add_conditional_edges("gate", after_gate, ["agent_loop", END])
    return graph


def score_draft(reply: Any, gate: GateConfig) -> dict[str, Any]:
    """Gate fields for a speculator reply; a draft that cannot be scored is rejected, with why."""
    logprobs = (getattr(reply, "response_metadata", None) or {}).get("logprobs")
    if not logprobs:
        log.warning(
            "speculator reply has no logprobs; the draft is rejected (request top_logprobs=K)"
        )
        return {
            "accepted": False,
            "error": "the speculator returned no logprobs: ask for them (ChatOpenAI(logprobs=True, "
            "top_logprobs=K) or ChatTransformersVLM(top_logprobs=K))",
        }
    try:
        return gate.evaluate(logprobs)
    except SeparabilityError as exc:
        return {"accepted": False, "error": f"gate: {exc}"}


def _failed(phase: str, exc: Exception, t0: float) -> dict[str, Any]:
    log.info("query failed in %s: %s", phase, exc)
    return {
        "error": f"{phase}: {type(exc).__name__}: {exc}",
        "timings": {phase: time.perf_counter() - t0},
    }
