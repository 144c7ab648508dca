"""The SpecReason baseline (the paper's comparison): speculate each reasoning *step*.

As the published ``SpecReason.py`` does it: the small model drafts the next step of the
large model's protocol (DeepEyes or Thyme); the large model scores the drafted step 0-9
(the published verification prompt, the first digit of a 10-token reply, 0 when there is
none); a step scoring 7 or more is kept, otherwise the large model writes the step itself,
and a tool call or code block in *its* step is executed. Accepted steps are joined with
newlines into one assistant message that both models continue from, in a new assistant
turn (the published chat layout). The loop ends at a step with an ``<answer>`` or after 6
steps.

Two published mistakes are not copied: the tool's or sandbox's output of a large-model
step is kept in the history, so the model sees what it asked for (the published loop runs
the tool and then drops its output), and the answer is the ``<answer>`` content of the
first step that has one (the published Thyme loop stops at any step containing the word
"answer").

Every call goes through the models' batch workers, so under ``graph.batch`` the drafts of
all queries at the same step batch together on the small model and the scores on the large.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool

from speceyes_tools.deadlines import DeadlineExceeded, deadline_scope
from speceyes_tools.images import ImageStore, store_scope

from .. import phases
from ..agents.loop import agent_system_prompt, emit_event, first_user_message, tool_trace
from ..effects import Blocking, Steps
from ..messages import Protocol, bare_model, dehydrate
from ..prompts import THYME_STOP, Prompts
from ..protocol import extract_answer, message_text, parse_deepeyes, parse_thyme
from ..state import SpecEyesState

if TYPE_CHECKING:
    from .nodes import NodeKit

__all__ = [
    "ACCEPT_SCORE",
    "SPECREASON_MAX_STEPS",
    "parse_score",
    "run_specreason",
    "specreason_node",
]

ACCEPT_SCORE = 7
SPECREASON_MAX_STEPS = 6  # the published loop stops after step 5, counting from 0
SCORE_MAX_TOKENS = 10
DEEPEYES_STEP_STOP = ("</tool_call>", "</answer>")

_DIGIT = re.compile(r"\d")


def parse_score(text: str) -> int:
    """The first digit of the scorer's reply; 0 when there is none (published)."""
    match = _DIGIT.search(text or "")
    return int(match.group()) if match else 0


def _new_turn(model: Any) -> dict[str, Any]:
    """Ask a local model for a new assistant turn after the history message (the published
    layout); served models start one by default."""
    local = getattr(bare_model(model), "continues_final_message", False)
    return {"continue_final_message": False} if local else {}


def run_specreason(
    *,
    call: Callable[..., Any],
    small: Any,
    large: Any,
    system: str,
    first: HumanMessage,
    protocol: Protocol,
    tools: Sequence[BaseTool],
    images: list[str],
    prompts: Prompts,
    store: ImageStore,
    max_steps: int = SPECREASON_MAX_STEPS,
    emit: Callable[[dict], None] = lambda event: None,
) -> Steps:
    """One query's SpecReason loop, as node steps (:mod:`speceyes_graph.effects`):
    ``call(model, messages, what, **kwargs)`` gives the steps of a model call within the
    query's deadline. Returns (``yield from``) the graph's output fields."""
    stop = list(THYME_STOP if protocol == "thyme" else DEEPEYES_STEP_STOP)
    base: list[BaseMessage] = [SystemMessage(content=system), first]
    history: list[dict] = []  # content blocks of the accepted steps (and tool outputs)
    steps: list[dict] = []
    by_name = {t.name: t for t in tools}
    answer = None
    for number in range(1, max_steps + 1):
        context = base + ([AIMessage(content=list(history))] if history else [])
        t0 = time.perf_counter()
        drafted = message_text(
            (yield from call(small, context, "specreason draft", stop=stop, **_new_turn(small)))
        )
        draft_s = time.perf_counter() - t0
        scoring = [*context, AIMessage(content=drafted), HumanMessage(content=prompts.verify)]
        t0 = time.perf_counter()
        score_text = message_text(
            (yield from call(large, scoring, "specreason score", max_tokens=SCORE_MAX_TOKENS))
        )
        score_s = time.perf_counter() - t0
        score = parse_score(score_text)
        step: dict[str, Any] = {
            "step": number,
            "drafted": drafted,
            "score": score,
            "score_text": score_text,
            "accepted": score >= ACCEPT_SCORE,
            "draft_latency_s": draft_s,
            "score_latency_s": score_s,
            "tool_calls": [],
        }
        if step["accepted"]:  # the small model's step stands; its tool calls are not run
            text = drafted
            step["model_latency_s"] = 0.0
        else:
            t0 = time.perf_counter()
            text = message_text(
                (yield from call(large, context, "specreason step", stop=stop, **_new_turn(large)))
            )
            step["model_latency_s"] = time.perf_counter() - t0
        step["model_text"] = text
        if history:
            history.append({"type": "text", "text": "\n"})
        history.append({"type": "text", "text": text})
        step["answer"] = extract_answer(text)
        if not step["accepted"] and step["answer"] is None:
            history.extend(
                (
                    yield Blocking(
                        _run_tools, (text, protocol, by_name, images, prompts, store, step)
                    )
                )
            )
        steps.append(step)
        emit({"specreason_step": step})
        if step["answer"] is not None:
            answer = step["answer"]
            break
    return {
        "answer": answer,
        "agent_steps": steps,
        "stop_reason": "answered" if answer is not None else "step_limit, no answer",
    }


def _run_tools(
    text: str,
    protocol: Protocol,
    tools: dict[str, BaseTool],
    images: list[str],
    prompts: Prompts,
    store: ImageStore,
    step: dict,
) -> list[dict]:
    """Execute the large model's tool call or code block; its output as history blocks."""
    if protocol == "thyme":
        calls = parse_thyme(text, next(iter(tools), "python_sandbox")).tool_calls
    else:
        calls = parse_deepeyes(text, set(tools)).tool_calls
    blocks: list[dict] = []
    for call in calls:  # parse_thyme returns the first code block only
        t0 = time.perf_counter()
        try:
            message = tools[call["name"]].invoke(
                {**call, "args": {**call["args"], "state": {"images": images}}}
            )
            message = dehydrate(message, store)
            content = message.content
            artifact = message.artifact if isinstance(message.artifact, dict) else {}
            error = artifact.get("error")
        except Exception as exc:  # a tool failure is an observation, not a crash
            content, artifact, error = f"Error: {type(exc).__name__}: {exc}", {}, str(exc)
        parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        opener, closer = (
            ("<sandbox_output>", "</sandbox_output>")
            if protocol == "thyme"
            else ("<tool_response>", prompts.tool_response_instruction + "</tool_response>")
        )
        blocks += [{"type": "text", "text": opener}, *parts, {"type": "text", "text": closer}]
        trace = {"name": call["name"], "arguments": call["args"], "error": error}
        trace["latency_s"] = time.perf_counter() - t0
        step["tool_calls"].append({**trace, **tool_trace(artifact)})
    return blocks


def specreason_node(kit: NodeKit) -> Callable[[SpecEyesState], Steps]:
    """The ``specreason`` node (``mode="specreason"``): one query's SpecReason loop with the
    graph's models, tools and protocol, within the query's deadline."""
    setup = kit.setup
    protocol = setup.protocol
    reason_system = agent_system_prompt(protocol, setup.prompts, setup.tools)
    small = phases.internal(setup.speculator, "specreason_small")
    large = phases.internal(setup.agent, "specreason_large")
    store = setup.store

    def specreason(state: SpecEyesState) -> Steps:
        t0 = time.perf_counter()
        query = state["query"]

        def call(model: Any, messages: list[BaseMessage], what: str, **kwargs: Any) -> Steps:
            return kit.ask(state, model, lambda: messages, what, announced=False, **kwargs)

        try:
            with deadline_scope(state.get("deadline")), store_scope(store):
                first = yield Blocking(first_user_message, (
                    protocol, setup.prompts, query["question"], query["images"], query["options"],
                    setup.resize, store,
                ))  # fmt: skip
                out = yield from run_specreason(
                    call=call, small=small, large=large, system=reason_system, first=first,
                    protocol=protocol, tools=setup.tools, images=query["images"],
                    prompts=setup.prompts, store=store, emit=emit_event,
                )  # fmt: skip
        except DeadlineExceeded as exc:
            return {**kit.failed(state, "specreason", exc, t0), "stop_reason": "deadline"}
        except Exception as exc:
            return kit.failed(state, "specreason", exc, t0)
        return {**out, "route": "specreason", "timings": {"specreason": time.perf_counter() - t0}}

    return specreason
