import asyncio
import operator
import os
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import GateConfig, SpeculationOptions, create_speceyes_graph, parse_judge
from speceyes_graph.gate.separability import acceptance_score
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.state import merge_timings


def build(j="no", s=None, a=None, **kw):
    return create_speceyes_graph(
        judge=judge(j), speculator=s or speculator(), agent=a or deepeyes_agent(), **kw
    ).compile()


def query(scene, q="What colour is the square?"):
    return {"question": q, "images": [scene], "options": ["red", "blue"]}


def test_speculative_route(scene):
    out = build("no", speculator("A", 9.0)).invoke(query(scene))
    assert out["route"] == "speculative" and out["answer"] == "A"
    assert out["draft"]["accepted"] and out["draft"]["score"] == pytest.approx(
        acceptance_score(9.0), rel=1e-6
    )
    assert out["agent_steps"] == [] and out["agent_messages"] == []
    assert "agent" not in out["timings"] and {"judge", "speculate"} <= set(out["timings"])
    assert out["judge_output"] == "no" and out.get("error") is None


def test_phases_ask_for_the_published_lengths(scene):
    j, s = judge("no"), speculator("A", 9.0)
    create_speceyes_graph(judge=j, speculator=s, agent=deepeyes_agent()).compile().invoke(
        query(scene)
    )
    assert j.call_kwargs[0]["max_tokens"] == 10 and s.call_kwargs[0]["max_tokens"] == 20
    j2 = judge("no")
    g = create_speceyes_graph(
        judge=j2,
        speculator=speculator(),
        agent=deepeyes_agent(),
        speculation=SpeculationOptions(judge_max_tokens=None),
    )
    g.compile().invoke(query(scene))
    assert "max_tokens" not in j2.call_kwargs[0]


def test_judged_agentic_route(scene):
    spec = speculator("A", 9.0)
    out = build("yes", spec).invoke(query(scene))
    assert out["route"] == "judged-agentic" and out["answer"] == "B"
    assert spec.calls == 0  # the small model never ran
    assert out.get("draft") is None and out["stop_reason"] == "answered"
    assert [s["step"] for s in out["agent_steps"]] == [1, 2]


def test_rejected_agentic_route(scene):
    out = build("no", speculator("A", 4.0)).invoke(query(scene))
    assert out["route"] == "rejected-agentic" and out["answer"] == "B"
    assert out["draft"]["text"] == "A" and out["draft"]["accepted"] is False
    assert out["draft"]["score"] < 0.98 and {"judge", "speculate", "agent"} <= set(out["timings"])


def test_gate_boundary_exactly_tau_is_rejected(scene):
    score = acceptance_score(7.0)
    at_tau = build("no", speculator("A", 7.0), gate=GateConfig(tau=score)).invoke(query(scene))
    draft_score = at_tau["draft"]["score"]
    exact = build("no", speculator("A", 7.0), gate=GateConfig(tau=draft_score)).invoke(query(scene))
    assert exact["route"] == "rejected-agentic"
    below = build("no", speculator("A", 7.0), gate=GateConfig(tau=draft_score - 1e-9)).invoke(
        query(scene)
    )
    assert below["route"] == "speculative"


@pytest.mark.parametrize(
    "text, tool_free",
    [
        ("no", True),
        ("No.", True),
        ("NO, tools add nothing", True),
        ("<think>easy</think>no", True),
        ("yes", False),
        ("Yes.", False),
        ("maybe", False),
        ("", False),
        ("I think no", False),
        ("**no**", True),
    ],
)
def test_judge_parsing(text, tool_free):
    assert parse_judge(text) is tool_free


def test_judge_output_neither_yes_nor_no_routes_to_agent(scene):
    out = build("I am not sure about that").invoke(query(scene))
    assert out["route"] == "judged-agentic" and out["answer"] == "B"


def test_mode_agent_is_the_baseline(scene):
    j, s = judge("no"), speculator()
    out = (
        create_speceyes_graph(judge=j, speculator=s, agent=deepeyes_agent(), mode="agent")
        .compile()
        .invoke(query(scene))
    )
    assert out["route"] == "agent-only" and out["answer"] == "B"
    assert j.calls == 0 and s.calls == 0


def test_mode_small_never_falls_back(scene):
    a = deepeyes_agent()
    out = (
        create_speceyes_graph(speculator=speculator("A", 3.0), agent=a, mode="small")
        .compile()
        .invoke(query(scene))
    )
    assert out["route"] == "draft-only" and out["answer"] == "A"
    assert out["draft"]["accepted"] is False  # score still recorded for offline sweeps
    assert a.calls == 0
    with pytest.raises(ValueError, match="speculator"):
        create_speceyes_graph(agent=a, mode="small")
    with pytest.raises(ValueError, match="agent"):
        create_speceyes_graph(speculator=speculator(), mode="speceyes")


def test_speculator_as_judge(scene):
    small = ScriptedChatModel(
        respond=lambda msgs: (
            "no"
            if "yes or no" in str(msgs[-1].content)
            else AIMessage(
                content="A", response_metadata=speculator().respond(msgs).response_metadata
            )
        )
    )
    g = create_speceyes_graph(judge="speculator", speculator=small, agent=deepeyes_agent())
    out = g.compile().invoke(query(scene))
    assert small.calls == 2  # the judge call and the draft
    assert out["route"] == "speculative"


def test_speculator_without_logprobs_falls_back_with_a_recorded_reason(scene):
    out = build("no", speculator("A", logprobs=False)).invoke(query(scene))
    assert out["route"] == "rejected-agentic" and out["answer"] == "B"
    assert "no logprobs" in out["draft"]["error"] and out["draft"]["accepted"] is False


def test_speculator_error_falls_back_and_judge_error_fails_the_query(scene):
    def boom(_):
        raise RuntimeError("CUDA out of memory")

    out = build("no", ScriptedChatModel(respond=boom)).invoke(query(scene))
    assert out["route"] == "rejected-agentic" and "CUDA out of memory" in out["draft"]["error"]
    assert out["answer"] == "B"
    failed = (
        create_speceyes_graph(
            judge=ScriptedChatModel(respond=boom), speculator=speculator(), agent=deepeyes_agent()
        )
        .compile()
        .invoke(query(scene))
    )
    assert failed["error"].startswith("judge: RuntimeError") and failed.get("answer") is None


def test_one_broken_query_does_not_affect_the_batch(scene, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    inputs = [query(scene), query(str(broken)), query(str(tmp_path / "missing.jpg")), query(scene)]
    outs = build("no", speculator("A", 9.0)).batch(inputs)
    assert [o.get("route") for o in outs] == ["speculative", None, None, "speculative"]
    assert outs[1]["error"].startswith("input: ImageLoadError") and "corrupt" in outs[1]["error"]
    assert "image file not found" in outs[2]["error"]
    # with return_exceptions, even an input the graph rejects outright stays contained
    outs = build().batch([query(scene), {"images": [scene]}, "not a dict"], return_exceptions=True)
    assert outs[0]["route"] == "speculative"
    assert "'question' must be a non-empty string" in outs[1]["error"]
    assert isinstance(outs[2], Exception)


def test_agent_model_error_fails_only_that_query(scene):
    def agent(msgs):
        if "boom" in "".join(str(m.content) for m in msgs):
            raise RuntimeError("server returned 500")
        return "<answer>B</answer>"

    g = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator(), agent=ScriptedChatModel(respond=agent)
    ).compile()
    outs = g.batch([query(scene, "boom?"), query(scene)])
    assert "server returned 500" in outs[0]["error"] and outs[0]["stop_reason"] == "error"
    assert outs[1]["answer"] == "B" and outs[1].get("error") is None


def test_async_invoke_and_batch(scene):
    g = build("no", speculator("A", 9.0))

    async def run():
        one = await g.ainvoke(query(scene))
        many = await g.abatch([query(scene), query(scene, "tiny?")])
        return one, many

    one, many = asyncio.run(run())
    assert one["route"] == "speculative" and [m["route"] for m in many] == [
        "speculative",
        "speculative",
    ]
    g2 = build("yes")
    assert asyncio.run(g2.ainvoke(query(scene)))["route"] == "judged-agentic"


def test_streaming_updates_show_routes_as_they_happen(scene):
    updates = list(build("no", speculator("A", 4.0)).stream(query(scene), stream_mode="updates"))
    nodes = [next(iter(u)) for u in updates]
    assert nodes == ["intake", "judge", "speculate", "gate", "agent_loop"]
    assert updates[3]["gate"]["route"] == "rejected-agentic"
    sub = list(build("yes").stream(query(scene), stream_mode="updates", subgraphs=True))
    inner = [next(iter(u)) for ns, u in sub if ns]
    assert inner == ["agent", "tools", "agent", "finish"]


def test_checkpointer_and_private_keys(scene):
    g = create_speceyes_graph(
        judge=judge("no"), speculator=speculator(), agent=deepeyes_agent()
    ).compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "q1"}}
    out = g.invoke(query(scene), cfg)
    assert "query" not in out and "settings" not in out  # private keys: in state, not output
    assert g.get_state(cfg).values["settings"]["tau"] == 0.98
    # the validated query is in state with images as references, never pixel arrays; the raw
    # input keys are not checkpointed at all
    values = g.get_state(cfg).values
    assert values["query"]["images"] == [os.path.realpath(scene)] and "images" not in values


def test_composition_inside_a_parent_graph(scene):
    class Parent(TypedDict, total=False):
        messages: Annotated[list, add_messages]
        question: str
        images: list[str]
        answer: str | None
        route: str | None
        agent_steps: list
        timings: Annotated[dict, merge_timings]
        log: Annotated[list, operator.add]

    speceyes = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator(), agent=deepeyes_agent()
    ).compile()

    def intake(state):
        return {
            "question": state["messages"][-1].content,
            "log": ["intake"],
            "timings": {"intake": 0.1},
        }

    def reply(state):
        return {
            "messages": [AIMessage(content=f"Answer: {state['answer']} via {state['route']}")],
            "log": ["reply"],
        }

    parent = StateGraph(Parent)
    parent.add_node("intake", intake)
    parent.add_node("speceyes", speceyes)
    parent.add_node("reply", reply)
    parent.add_edge(START, "intake")
    parent.add_edge("intake", "speceyes")
    parent.add_edge("speceyes", "reply")
    parent.add_edge("reply", END)
    out = parent.compile().invoke(
        {"messages": [HumanMessage(content="What colour?")], "images": [scene], "log": []}
    )
    assert out["answer"] == "B" and out["route"] == "judged-agentic"
    assert [m.type for m in out["messages"]] == ["human", "ai"]  # no duplicated messages
    assert out["log"] == ["intake", "reply"]  # parent list reducer applied once per write
    assert len(out["agent_steps"]) == 2  # written once by the subgraph, not doubled
    assert {"intake", "judge", "agent"} <= set(out["timings"])  # dict merge is shared both ways
    assert "query" not in out and "draft" not in out  # private / unshared keys stay inside


def test_state_is_serializable_for_checkpoints(scene):
    out = build("no", speculator("A", 4.0)).invoke(query(scene))
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    restored = serde.loads_typed(serde.dumps_typed(out))
    assert restored["draft"]["text"] == "A" and len(restored["agent_messages"]) == len(
        out["agent_messages"]
    )
