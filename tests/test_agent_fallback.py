"""Any agent that speaks messages as the graph's fallback (``create_speceyes_graph(agent=...)``
with a ``create_agent(...)`` result or a user's own ``StateGraph``): its final answer is the
graph's answer, its steps are recorded, its errors are the query's error. And the graph's
options: grouped where they belong, the old keywords still accepted, conflicts refused; the
phases callable on their own."""

from __future__ import annotations

import asyncio

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from helpers import judge, question_of, speculator
from speceyes_graph import (
    GateConfig,
    LoopOptions,
    SpeculationOptions,
    create_speceyes_graph,
)
from speceyes_graph.effects import arun_steps, run_steps
from speceyes_graph.graph.options import resolve_setup
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.phases import draft, gate
from speceyes_graph.phases import judge as judge_phase
from speceyes_graph.protocol import message_text
from speceyes_tools.vision import make_zoom_tool


def query(scene, q="What colour is the square?"):
    return {"question": q, "images": [scene], "options": ["red", "blue"]}


def zooming_model(answer="B"):
    """Native tool calls: zooms once, answers after the crop."""

    def respond(msgs):
        if any(isinstance(m, ToolMessage) for m in msgs):
            return f"<think>now I see</think><answer>{answer}</answer>"
        call = {"name": "zoom", "args": {"bbox": [90, 90, 210, 210]}, "id": "z1"}
        return AIMessage(content="zooming", tool_calls=[call])

    return ScriptedChatModel(respond=respond)


def test_a_create_agent_result_is_the_fallback(scene):
    model = zooming_model()
    user_agent = create_agent(model, [make_zoom_tool()])
    graph = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator("A"), agent=user_agent
    ).compile()
    out = graph.invoke(query(scene))
    assert (out["route"], out["answer"], out["error"]) == ("judged-agentic", "B", None)
    assert out["stop_reason"] == "answered"
    first, second = out["agent_steps"]
    assert first["model_text"] == "zooming" and first["tool_calls"][0]["name"] == "zoom"
    zoom = first["tool_calls"][0]
    assert len(zoom["box"]) == 4 and not zoom["error"]  # the box after mapping and clamping
    assert second["answer"] == "B"
    assert [m.type for m in out["agent_messages"]] == ["human", "ai", "tool", "ai"]
    assert "base64" not in str(out["agent_messages"])  # kept as the image store's keys
    # the agent was sent the question as the native loop writes it, and the image itself
    sent = model.received[0][-1]
    assert "Options" in message_text(sent) and "A. red" in message_text(sent)
    assert any(b.get("type") == "image" and b.get("base64") for b in sent.content)
    # the same under ainvoke
    assert asyncio.run(graph.ainvoke(query(scene)))["answer"] == "B"


def test_a_rejected_draft_goes_to_the_given_agent(scene):
    graph = create_speceyes_graph(
        judge=judge("no"),
        speculator=speculator("A", 5.0),
        agent=create_agent(zooming_model("A"), [make_zoom_tool()]),
    ).compile()
    out = graph.invoke(query(scene))
    assert out["route"] == "rejected-agentic" and out["answer"] == "A"
    assert out["draft"]["accepted"] is False


def one_node_agent(step):
    """A user's own agent: a compiled StateGraph over messages with one node."""
    builder = StateGraph(MessagesState)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile()


def test_a_users_own_messages_graph_is_the_fallback(scene):
    seen = []

    def answer(state: MessagesState):
        seen.append(state["messages"])
        return {"messages": [AIMessage(content="It is red.")]}

    graph = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator("A"), agent=one_node_agent(answer)
    ).compile()
    out = graph.invoke(query(scene))
    assert out["answer"] == "It is red." and out["error"] is None
    assert len(seen) == 1 and seen[0][0].type == "human"


def test_the_given_agents_errors_are_the_querys(scene):
    def broken(msgs):
        raise RuntimeError("the agent's server is down")

    failing = create_agent(ScriptedChatModel(respond=broken), [])
    graph = create_speceyes_graph(judge=judge("yes"), speculator=speculator("A"), agent=failing)
    out = graph.compile().invoke(query(scene))
    assert out["answer"] is None and "server is down" in out["error"]
    assert out["error"].startswith("agent: ")
    with pytest.raises(Exception, match="server is down"):
        create_speceyes_graph(
            judge=judge("yes"), speculator=speculator("A"), agent=failing, on_error="raise"
        ).compile().invoke(query(scene))

    # a last message that is not an answer (the agent stopped on a tool call)
    def silent(state: MessagesState):
        return {
            "messages": [AIMessage(content="", tool_calls=[{"name": "x", "args": {}, "id": "1"}])]
        }

    out = (
        create_speceyes_graph(
            judge=judge("yes"), speculator=speculator("A"), agent=one_node_agent(silent)
        )
        .compile()
        .invoke(query(scene))
    )
    assert out["answer"] is None and "not an answer" in out["error"]


def test_an_agent_that_is_not_a_chat_model_needs_a_judge(scene):
    user_agent = create_agent(zooming_model(), [make_zoom_tool()])
    with pytest.raises(ValueError, match="cannot judge"):
        create_speceyes_graph(speculator=speculator("A"), agent=user_agent)
    with pytest.raises(TypeError, match="agent must be"):
        create_speceyes_graph(speculator=speculator("A"), agent=42, judge=judge("no"))
    # the small model may judge (the paper's ablation)
    small = ScriptedChatModel(
        respond=lambda m: "no" if "yes or no" in question_of(m) else speculator("A").respond(m)
    )
    out = create_speceyes_graph(speculator=small, agent=user_agent, judge="speculator")
    assert out.compile().invoke(query(scene))["route"] == "speculative"
    with pytest.raises(ValueError, match="specreason"):
        create_speceyes_graph(
            speculator=small, agent=user_agent, judge="speculator", mode="specreason"
        )


# --- options ---------------------------------------------------------------------------------


def setup_of(**kw):
    args = dict(
        speculator=speculator("A"), agent=zooming_model(), judge=None, tools="deepeyes",
        mode="speceyes", gate=None, speculation=None, loop=None, prompts=None, resize=None,
        limits=None, store=None, on_error="record",
    )  # fmt: skip
    return resolve_setup(**{**args, **kw})


@pytest.mark.parametrize(
    "old",
    [
        {"max_agent_steps": 3},
        {"protocol": "native"},
        {"speculator_as_judge": True},
        {"judge_max_tokens": 5},
        {"speculation_depth": 1},
        {"speculator_resize": None},
    ],
)
def test_the_keywords_of_the_groups_are_not_taken_loose(old):
    """Each setting lives in its group (``loop=LoopOptions(max_steps=3)``); the loose
    keywords of the unreleased drafts are refused by name rather than aliased."""
    with pytest.raises(TypeError, match=next(iter(old))):
        create_speceyes_graph(speculator=speculator("A"), agent=zooming_model(), **old)


def test_the_groups_resolve_and_bad_values_are_refused():
    setup = setup_of(
        loop=LoopOptions(protocol="native", max_steps=3),
        speculation=SpeculationOptions(start="parallel", judge_max_tokens=5, depth=2),
    )
    assert (setup.protocol, setup.parallel, setup.max_steps) == ("native", True, 3)
    assert setup.speculation.judge_max_tokens == 5 and setup.speculation.depth == 2
    ablation = setup_of(judge="speculator")
    assert ablation.judge is ablation.speculator
    with pytest.raises(ValueError, match="max_agent_steps must be"):
        setup_of(loop=LoopOptions(max_steps=0))
    with pytest.raises(ValueError, match="start"):
        SpeculationOptions(start="eventually")


def test_defaults_follow_the_protocol():
    thyme = setup_of(tools="thyme")
    assert thyme.protocol == "thyme" and thyme.gate.tau == 0.95 and thyme.max_steps == 5
    deepeyes = setup_of()
    assert deepeyes.protocol == "deepeyes" and deepeyes.gate.tau == 0.98 and deepeyes.max_steps == 6
    assert setup_of(tools="vision").protocol == "native"

    # depth-D speculation: the small loop's turns are as long as the agent's by default
    class Long(ScriptedChatModel):
        max_tokens: int = 256

    assert setup_of(agent=Long(respond=lambda m: "x")).speculation.step_tokens == 256


def test_the_phases_on_their_own(scene):
    """judge, draft and gate are callable outside any graph, sync and async."""
    q = {"question": "What colour?", "images": [scene], "options": ["red", "blue"]}
    large, small = judge("no"), speculator("blue", 9.0)
    verdict = run_steps(judge_phase(large, q))
    assert not verdict.tools_needed and verdict.output == "no"
    assert large.call_kwargs[-1]["max_tokens"] == 10
    reply = asyncio.run(arun_steps(draft(small, q)))
    assert small.call_kwargs[-1]["max_tokens"] == 20
    kept = gate(reply, GateConfig())
    assert kept["accepted"] and kept["text"] == "blue" and kept["score"] > 0.98
    assert not gate(reply, GateConfig(tau=0.999))["accepted"]
    assert run_steps(judge_phase(judge("Yes."), q)).tools_needed
    empty = gate(AIMessage(content=" "), GateConfig())
    assert not empty["accepted"] and empty["error"]
