"""Phase IV in the graph: the agent that answers what speculation did not.

The fallback is either the built-in agent loop (:func:`~speceyes_graph.agents.loop.create_agent_loop`:
DeepEyes' text protocol, Thyme's code, or native tool calls, with its step bound and its
trace), or **any agent that speaks messages**: a ``langchain.agents.create_agent(...)``
result, a user's own ``StateGraph`` over ``messages``, any Runnable taking
``{"messages": [...]}``. A given agent is sent the query as one human message (the images as
base64 blocks of the originals, then the question as the built-in loop's native protocol
writes it); its last message is the query's answer (the content of an ``<answer>`` tag when
it writes one), each of its model turns is a recorded step with the tool calls it made and
their results, and its exception is the query's error.

Either way the fallback runs without checkpoints of its own (its transcript reaches the
graph's state once, at the end, with its images as the image store's keys), within the
query's deadline, and hidden from ``stream_mode="messages"`` like every internal model call.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableBinding, RunnableConfig
from langgraph.constants import TAG_NOSTREAM
from langgraph.pregel import Pregel
from langgraph.runtime import Runtime

from speceyes_tools.codec import sniff_mime
from speceyes_tools.deadlines import DeadlineExceeded, check_deadline, deadline_scope
from speceyes_tools.images import ImageStore

from ..agents.loop import (
    AgentLoopInput,
    attach_tool_results,
    create_agent_loop,
    recursion_limit,
)
from ..effects import Blocking, Steps, Subgraph, run_steps, unavailable
from ..gate.online_steps import AgentStopped, OnlineSteps, Verdict
from ..messages import dehydrate
from ..protocol import extract_answer, message_text
from ..settings import resolve_settings
from ..state import AgentStep, Draft, SpecEyesContext, SpecEyesState
from .nodes import NodeKit, SpecEyesError

__all__ = ["AgentFallback", "agent_loop_node", "steps_of"]


def _unsaved(agent: Any) -> Any:
    """The agent without checkpoints of its own: a compiled graph run inside a node would
    otherwise checkpoint into the caller's thread (or its own saver) at every step."""
    if isinstance(agent, Pregel):
        return agent.copy(update={"checkpointer": False})
    if isinstance(agent, RunnableBinding) and isinstance(agent.bound, Pregel):
        return agent.model_copy(update={"bound": agent.bound.copy(update={"checkpointer": False})})
    return agent


def steps_of(messages: list[BaseMessage]) -> list[AgentStep]:
    """A given agent's model turns as steps: text, tool calls with their results."""
    steps: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        text = message_text(message)
        calls = [
            {"name": c["name"], "arguments": c["args"], "id": c["id"]} for c in message.tool_calls
        ]
        steps.append(
            {
                "step": len(steps) + 1,
                "model_text": text,
                "tool_calls": calls,
                "answer": None if calls else (extract_answer(text) or text.strip() or None),
                "problem": None,
            }
        )
    attach_tool_results(steps, messages)
    return steps  # type: ignore[return-value]


class AgentFallback:
    """The query's run of the fallback agent: its input, the run itself, its output as the
    graph's fields. ``graph`` is what runs (the compiled built-in loop, or the given agent)."""

    def __init__(self, kit: NodeKit) -> None:
        setup = self.setup = kit.setup
        self.store: ImageStore = setup.store
        self.given = setup.agent_graph is not None
        self.graph: Any
        if self.given:
            self.graph = setup.agent_graph
        else:
            assert setup.agent is not None  # a graph with a fallback has one of the two
            self.graph = create_agent_loop(
                setup.agent,
                setup.tools,
                protocol=setup.protocol,
                max_steps=setup.max_steps,
                prompts=setup.prompts,
                resize=setup.resize,
                store=setup.store,
                options=setup.loop,
            ).compile(name="agent_loop")

    def loop_input(
        self, state: Mapping[str, Any], draft: Draft, deadline: float | None
    ) -> AgentLoopInput:
        query, settings = state["query"], state["settings"]
        return {
            "question": query["question"],
            "images": query["images"],
            "options": query["options"],
            "draft": None if draft.get("discarded") else (draft or None),
            "max_steps": settings["max_agent_steps"],
            "deadline": deadline,
            "model_timeout_s": settings["model_timeout_s"],
            "tool_timeout_s": settings["tool_timeout_s"],
        }

    def messages_input(self, query: Mapping[str, Any]) -> dict[str, Any]:
        """A given agent's input: one human message, images (original bytes) then question."""
        blocks: list[str | dict[str, Any]] = []
        for ref in query["images"]:
            data = self.store.encoded(ref)
            blocks.append(
                {
                    "type": "image",
                    "base64": base64.b64encode(data).decode("ascii"),
                    "mime_type": sniff_mime(data),
                }
            )
        text = self.setup.prompts.question(query["question"], query["options"])
        blocks.append({"type": "text", "text": text})
        return {"messages": [HumanMessage(content=blocks)]}

    def run(self, state: Mapping[str, Any], draft: Draft, config: RunnableConfig) -> Steps:
        """The fallback on this query (``out = yield from fallback.run(...)``): the graph's
        output fields (answer, steps, transcript, stop reason, timings)."""
        deadline = state.get("deadline")
        if not self.given:
            config = {
                **config,
                "recursion_limit": recursion_limit(state["settings"]["max_agent_steps"]),
            }
            # The loop runs without checkpoints of its own: its transcript reaches the parent
            # state once, at the end (a resumed run restarts the loop). `self.graph` itself
            # stays the subgraph that get_graph(xray=True) and Studio draw.
            return (
                yield Subgraph(
                    self.graph.copy(update={"checkpointer": False}),
                    self.loop_input(state, draft, deadline),
                    config,
                )
            )
        t0 = time.time()
        sent = yield Blocking(self.messages_input, (state["query"],))
        config = {**config, "tags": [*config.get("tags", []), TAG_NOSTREAM]}
        with deadline_scope(deadline):
            out = yield Subgraph(_unsaved(self.graph), sent, config, what="agent")
        messages = list((out or {}).get("messages") or []) if isinstance(out, Mapping) else []
        kept = yield Blocking(lambda: [dehydrate(m, self.store) for m in messages])
        steps = steps_of(kept)
        last = kept[-1] if kept else None
        answer = steps[-1]["answer"] if steps and isinstance(last, AIMessage) else None
        result: dict[str, Any] = {
            "answer": answer,
            "stop_reason": "answered" if answer else "no answer",
            "agent_messages": kept,
            "agent_steps": steps,
            "timings": {"agent": time.time() - t0},
        }
        if not answer:
            result["error"] = "agent: its last message is not an answer (no final reply)"
        return result

    def shadow_answer(self, state: Mapping[str, Any], draft: Draft) -> str | None:
        """The agent's answer to a query whose draft was accepted (a shadow run: in a thread
        of its own, with a deadline of its own, traced as its own run), under the
        deployment's settings whatever the run's were: its label is the gate's, not the
        client's. Raises :class:`~speceyes_graph.gate.online_steps.AgentStopped` when the
        agent stopped without a verdict (no label, and no sign the labels stopped)."""
        settings = resolve_settings(None, self.setup.defaults, self.setup.limits).as_dict()
        state = {**state, "settings": settings}
        deadline = time.time() + settings["query_timeout_s"]
        config: RunnableConfig = {
            "run_name": "shadow_verification",
            "tags": ["speceyes:shadow"],
            "metadata": {"gate_key": state.get("gate_key")},
        }
        with deadline_scope(deadline):
            out = run_steps(self.run({**state, "deadline": deadline}, draft, config))
        if verdict(out) != "answered":
            why = out.get("error") or f"the shadow run gave no answer: {out.get('stop_reason')}"
            # a limit stopped it: no label, and no sign that the labels stopped; any other
            # failure is a lost shadow (the gate tightens when too many are)
            limit = str(out.get("stop_reason") or "").startswith(("step_limit", "deadline"))
            raise AgentStopped(why) if limit else RuntimeError(why)
        return str(out["answer"])


def verdict(out: Mapping[str, Any]) -> Verdict:
    """How the agent's run ended, for the online gate: it answered itself, it was
    unavailable (:func:`~speceyes_graph.effects.unavailable`), or it stopped without a
    verdict (its step limit, the deadline, a failure of the query's own)."""
    if answered_itself(out):
        return "answered"
    return "unavailable" if out.get("stop_reason") == "unavailable" else "stopped"


def answered_itself(out: Mapping[str, Any]) -> bool:
    """Whether the agent gave an answer of its own: not an error, not the draft it fell
    back to at its step limit (which would label the draft by itself)."""
    reason = out.get("stop_reason") or ""
    return bool(out.get("answer")) and not out.get("error") and "with the draft" not in reason


def agent_loop_node(
    kit: NodeKit, fallback: AgentFallback, online: OnlineSteps | None
) -> Callable[[SpecEyesState, RunnableConfig, Runtime[SpecEyesContext]], Steps]:
    """The ``agent_loop`` node: the fallback on the query, its failure the query's."""

    def agent_loop(
        state: SpecEyesState, config: RunnableConfig, runtime: Runtime[SpecEyesContext]
    ) -> Steps:
        t0 = time.perf_counter()
        settings = state["settings"]
        try:
            with deadline_scope(state.get("deadline")):
                check_deadline("agent loop")
            if fallback.graph is None:  # named in the body: xray drawings and Studio find it
                raise RuntimeError("this graph has no agent")
            out = yield from fallback.run(state, state.get("draft") or {}, {})
        except DeadlineExceeded as exc:
            out = {**kit.failed(state, "agent", exc, t0), "stop_reason": "deadline"}
        except Exception as exc:
            out = kit.failed(state, "agent", exc, t0)
            if unavailable(exc):
                out["stop_reason"] = "unavailable"
        if online is not None and state.get("gate_key"):  # what the agent says of this run
            key = online.run_key(config, state["gate_key"])
            query: Mapping[str, Any] = state.get("query") or {}
            yield from online.after_agent(
                key, out.get("answer"), verdict(out), state.get("draft"), query.get("options"),
                runtime.store,
            )  # fmt: skip
        if out.get("error") and settings["on_error"] == "raise":
            raise SpecEyesError(out["error"])
        return out

    return agent_loop
