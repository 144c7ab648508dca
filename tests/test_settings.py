"""Per-run settings through LangGraph's context, and a gate that never trusts its input."""

import pytest
from langchain_core.messages import AIMessage

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import GateConfig, Limits, LoopOptions, SpecEyesError, create_speceyes_graph
from speceyes_graph.gate.separability import acceptance_score
from speceyes_graph.models import ScriptedChatModel, fake_logprobs


def build(j="no", s=None, a=None, **kw):
    return create_speceyes_graph(
        judge=judge(j), speculator=s or speculator("A", 7.0), agent=a or deepeyes_agent(), **kw
    ).compile()


def q(scene):
    return {"question": "colour?", "images": [scene], "options": ["red", "blue"]}


def test_tau_k_and_aggregation_per_run(scene):
    g = build()  # draft separability 7.0: score 0.985 > 0.98
    assert g.invoke(q(scene))["route"] == "speculative"
    strict = g.invoke(q(scene), context={"tau": 0.99})
    assert strict["route"] == "rejected-agentic" and strict["draft"]["score"] == pytest.approx(
        acceptance_score(7.0), rel=1e-6
    )
    # the same through config["configurable"] (older clients)
    assert g.invoke(q(scene), {"configurable": {"tau": 0.99}})["route"] == "rejected-agentic"
    # K changes the score; the draft carries the K it was scored with
    fewer = g.invoke(q(scene), context={"k": 8})
    assert len(fewer["draft"]["top_logprobs"][0]) == 8
    assert fewer["draft"]["separability"] != pytest.approx(7.0)
    # the graph's own defaults are untouched by a run's overrides
    assert g.invoke(q(scene))["route"] == "speculative"


def test_mode_per_run(scene):
    g = build()
    assert g.invoke(q(scene), context={"mode": "agent"})["route"] == "agent-only"
    small = g.invoke(q(scene), context={"mode": "small"})
    assert (
        small["route"] == "draft-only" and small["answer"] == "A" and small["judge_output"] is None
    )
    # a graph without an agent cannot switch to agent mode: a clear error, not a crash
    only_small = create_speceyes_graph(speculator=speculator(), mode="small").compile()
    out = only_small.invoke(q(scene), context={"mode": "agent"})
    assert "needs models this graph was built without" in out["error"]


def never_answers():
    call = '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 50, 50]}}'
    return ScriptedChatModel(respond=lambda m: f"<tool_call>{call}</tool_call>")


def test_max_agent_steps_per_run_and_the_recursion_limit_follows(scene):
    g = build(
        "yes", a=never_answers(), loop=LoopOptions(max_steps=13)
    )  # used to raise GraphRecursionError
    out = g.invoke(q(scene))
    assert len(out["agent_steps"]) == 13 and out["stop_reason"].startswith("step_limit")
    assert len(g.invoke(q(scene), context={"max_agent_steps": 3})["agent_steps"]) == 3
    assert len(g.invoke(q(scene), context={"max_agent_steps": 20})["agent_steps"]) == 20
    too_many = g.invoke(q(scene), context={"max_agent_steps": 33})
    assert "max_agent_steps must be 1..32" in too_many["error"]


@pytest.mark.parametrize(
    "context, message",
    [
        ({"tau": "high"}, "tau must be a number"),
        ({"tau": 1.5}, "tau must be in [0, 1]"),
        ({"k": 1}, "k must be at least 2"),
        ({"aggregation": "max"}, "aggregation must be one of"),
        ({"mode": "fast"}, "mode must be one of"),
        ({"model_timeout_s": -1}, "model_timeout_s must be positive"),
        ({"on_error": "ignore"}, "on_error must be"),
    ],
)
def test_bad_settings_are_recorded_errors(scene, context, message):
    out = build().invoke(q(scene), context=context)
    assert out["error"].startswith("settings: SettingsError") and message in out["error"]


def test_deadlines_can_only_be_shortened_per_run(scene):
    from langgraph.checkpoint.memory import InMemorySaver

    cfg = {"configurable": {"thread_id": "x"}}
    g = create_speceyes_graph(
        judge=judge("no"),
        speculator=speculator("A", 7.0),
        agent=deepeyes_agent(),
        limits=Limits(query_timeout_s=60, model_timeout_s=5),
    ).compile(checkpointer=InMemorySaver())
    g.invoke(q(scene), cfg, context={"query_timeout_s": 1e9, "model_timeout_s": 1})
    settings = g.get_state(cfg).values["settings"]
    assert settings["query_timeout_s"] == 60 and settings["model_timeout_s"] == 1


def test_raise_instead_of_record(scene):
    g = build()
    with pytest.raises(SpecEyesError, match="image file not found"):
        g.invoke({"question": "q", "images": ["/nope.png"]}, context={"on_error": "raise"})

    def down(messages):
        raise RuntimeError("server down")

    broken = create_speceyes_graph(
        judge=ScriptedChatModel(respond=down),
        speculator=speculator(),
        agent=deepeyes_agent(),
        on_error="raise",
    ).compile()
    with pytest.raises(SpecEyesError, match="judge: RuntimeError: server down"):
        broken.invoke(q(scene))
    assert build(on_error="raise").invoke(q(scene))["route"] == "speculative"


def reply_with(logprobs, text="A"):
    return ScriptedChatModel(
        respond=lambda m: AIMessage(content=text, response_metadata={"logprobs": logprobs})
    )


@pytest.mark.parametrize(
    "logprobs",
    [
        {"content": [None]},
        42,
        {"content": [{"token": "A", "logprob": -0.1, "top_logprobs": 5}]},
        {"content": [{"token": "A", "logprob": -0.1, "top_logprobs": [{"token": "A"}]}]},
        {"content": [{"token": "A", "top_logprobs": [{"logprob": "x"}] * 64}]},
        {"content": "AAAA"},
        {"content": [{"token": "A", "top_logprobs": [{"logprob": float("nan")}] * 64}]},
        {"content": [{"token": "A", "top_logprobs": []}]},
        {"content": {"token": "A"}},
    ],
)
def test_malformed_logprobs_are_recorded_rejections(scene, logprobs):
    out = build(s=reply_with(logprobs)).invoke(q(scene))
    assert out["error"] is None and out["route"] == "rejected-agentic"
    assert out["draft"]["accepted"] is False and out["draft"]["error"].startswith("gate: ")
    assert out["answer"] == "B"  # the agent answered instead


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_an_empty_draft_is_never_accepted(scene, text):
    confident = fake_logprobs(["\n"], [40.0])  # very separable, but says nothing
    out = build(s=reply_with(confident, text)).invoke(q(scene))
    assert out["draft"]["accepted"] is False and "empty" in out["draft"]["error"]
    assert out["route"] == "rejected-agentic"
    small = build(s=reply_with(confident, text), mode="small").invoke(q(scene))
    assert small["route"] == "draft-only" and small["answer"] is None


def test_gate_config_replace():
    g = GateConfig(tau=0.9, k=16, aggregation="mean", clamp=True)
    h = g.replace(tau=0.5)
    assert (h.tau, h.k, h.aggregation, h.clamp) == (0.5, 16, "mean", True) and g.tau == 0.9
