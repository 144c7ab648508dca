"""Depth-D speculation: the small model's own tool loop before the large agent (scripted models)."""

import itertools
import json
import threading

import pytest
from langchain_core.messages import AIMessage

from helpers import deepeyes_agent, judge
from speceyes_graph import GateConfig, SpeculationOptions, create_speceyes_graph
from speceyes_graph.gate.separability import acceptance_score, answer_span
from speceyes_graph.models import ScriptedChatModel, fake_logprobs
from speceyes_graph.protocol import message_text
from speceyes_graph.settings import Limits

ANSWER_TOKENS = ["<think>", "I", "see", "it", "</think>", "<answer>", "red", "</answer>"]


def small_agent(answer_sep=9.0, think_sep=3.0, zooms=1, bbox=(0, 0, 64, 64), draft="blue"):
    """A small model that drafts tool-free (speculator prompt) or, in the tool loop, zooms
    ``zooms`` times then answers "red"; its think tokens are unsure, its answer token sure."""

    def respond(msgs):
        system = message_text(msgs[0]) if msgs and msgs[0].type == "system" else ""
        if "tool" not in system:  # the tool-free draft
            return AIMessage(
                content=draft, response_metadata={"logprobs": fake_logprobs([draft], [9.0])}
            )
        done = sum("<tool_response>" in message_text(m) for m in msgs if m.type == "human")
        if done < zooms:
            call = json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": list(bbox)}})
            text = f"<think>zoom</think><tool_call>\n{call}\n</tool_call>"
            return AIMessage(
                content=text, response_metadata={"logprobs": fake_logprobs(["x"], [9.0])}
            )
        sure = answer_sep() if callable(answer_sep) else answer_sep
        seps = [think_sep] * 5 + [9.0, sure, 9.0]
        return AIMessage(
            content="".join(ANSWER_TOKENS),
            response_metadata={"logprobs": fake_logprobs(ANSWER_TOKENS, seps)},
        )

    return ScriptedChatModel(respond=respond)


def build(small, agent=None, depth=1, small_resize=None, **kw):
    return create_speceyes_graph(
        judge=judge("yes"),
        speculator=small,
        agent=agent or deepeyes_agent(answer="green"),
        speculation=SpeculationOptions(depth=depth, resize=small_resize),
        **kw,
    ).compile()


def query(scene):
    return {"question": "What colour is the dot?", "images": [scene]}


def test_accepted_small_loop_answers_with_route_speculative_tools(scene):
    agent = deepeyes_agent(answer="green")
    out = build(small_agent(), agent).invoke(query(scene))
    assert out["route"] == "speculative-tools" and out["answer"] == "red"
    assert agent.calls == 0 and out["agent_steps"] == []
    tool = out["tool_draft"]
    assert tool["accepted"] and tool["depth"] == 1 and tool["stop_reason"] == "answered"
    # only the answer's tokens are gated: the unsure think tokens do not count
    assert tool["tokens"] == ["red"]
    assert tool["score"] == pytest.approx(acceptance_score(9.0), rel=1e-6)
    zoom, answer = tool["steps"]
    assert zoom["tool_calls"][0]["box"] and zoom["tool_calls"][0]["error"] is None
    assert answer["answer"] == "red" and "logprobs" not in answer
    assert tool["latency_s"] > 0 and "speculate_tools" in out["timings"]


def test_rejected_small_loop_falls_back_exactly_as_depth_zero(scene):
    unsure = small_agent(answer_sep=3.0)
    depth1 = build(unsure, depth=1).invoke(query(scene))
    depth0 = build(small_agent(answer_sep=3.0), depth=0).invoke(query(scene))
    assert depth1["route"] == depth0["route"] == "judged-agentic"
    assert depth1["tool_draft"]["accepted"] is False and depth1["tool_draft"].get("error") is None
    assert depth0["tool_draft"] is None
    for key in ("answer", "stop_reason", "judge_output", "draft", "error"):
        assert depth1[key] == depth0[key], key

    def trace(steps):  # all but the random call ids and the latencies
        return [
            (s["model_text"], s["answer"], [(c["arguments"], c["box"]) for c in s["tool_calls"]])
            for s in steps
        ]

    assert trace(depth1["agent_steps"]) == trace(depth0["agent_steps"])
    assert [m.content for m in depth1["agent_messages"]] == [
        m.content for m in depth0["agent_messages"]
    ]


def test_no_answer_within_depth_steps_is_a_rejection(scene):
    out = build(small_agent(zooms=2), depth=1).invoke(query(scene))
    tool = out["tool_draft"]
    assert out["route"] == "judged-agentic" and out["answer"] == "green"
    assert not tool["accepted"] and "step limit" in tool["error"] and len(tool["steps"]) == 2
    # with two steps allowed the same model answers
    assert build(small_agent(zooms=2), depth=2).invoke(query(scene))["route"] == "speculative-tools"


def test_small_loop_failure_is_recorded_and_the_agent_answers(scene):
    def broken(msgs):
        if "tool" in message_text(msgs[0]):
            raise RuntimeError("small model down")
        return AIMessage(
            content="blue", response_metadata={"logprobs": fake_logprobs(["blue"], [9.0])}
        )

    out = build(ScriptedChatModel(respond=broken)).invoke(query(scene))
    assert out["route"] == "judged-agentic" and out["answer"] == "green" and out["error"] is None
    assert "small model down" in out["tool_draft"]["error"]


def test_tau_depth_is_its_own_threshold_per_graph_and_per_run(scene):
    small = small_agent(answer_sep=4.0)  # sigmoid(0.6*4) = 0.917: below 0.98, above 0.9
    assert build(small).invoke(query(scene))["route"] == "judged-agentic"
    lenient = build(small, gate=GateConfig(tau_depth=0.9)).invoke(query(scene))
    assert lenient["route"] == "speculative-tools"
    per_run = build(small).invoke(query(scene), context={"tau_depth": 0.9})
    assert per_run["route"] == "speculative-tools"
    # the tool-free tau is untouched by tau_depth
    assert (
        GateConfig(tau_depth=0.9).tau == 0.98 and GateConfig(tau_depth=0.9).after_tools().tau == 0.9
    )


def test_depth_per_run_and_its_ceiling(scene):
    graph = build(small_agent(), depth=0, limits=Limits(max_speculation_depth=2))
    assert graph.invoke(query(scene))["route"] == "judged-agentic"
    on = graph.invoke(query(scene), context={"speculation_depth": 1})
    assert on["route"] == "speculative-tools"
    too_deep = graph.invoke(query(scene), context={"speculation_depth": 3})
    assert too_deep["answer"] is None and "speculation_depth must be 0..2" in too_deep["error"]
    with pytest.raises(ValueError, match="speculation_depth"):
        build(small_agent(), depth=9)


def test_tool_free_queries_are_unchanged_by_depth(scene):
    graph = create_speceyes_graph(
        judge=judge("no"),
        speculator=small_agent(),
        agent=deepeyes_agent(),
        speculation=SpeculationOptions(depth=1),
    ).compile()
    out = graph.invoke(query(scene))
    assert out["route"] == "speculative" and out["answer"] == "blue" and out["tool_draft"] is None


def test_small_loop_boxes_are_in_the_small_models_frame(scene, tmp_path):
    """The default small toolset maps boxes through the speculator's resize, not the agent's."""
    from conftest import write_scene

    from speceyes_tools.images import ResizeSpec

    big = write_scene(tmp_path / "big.png", size=(448, 448))
    small_frame = ResizeSpec(factor=32, min_pixels=224 * 224, max_pixels=224 * 224)
    graph = build(
        small_agent(bbox=(0, 0, 112, 112)),
        resize=ResizeSpec(factor=28, min_pixels=448 * 448, max_pixels=448 * 448),
        small_resize=small_frame,
    )
    out = graph.invoke({"question": "What colour?", "images": [big]})
    box = out["tool_draft"]["steps"][0]["tool_calls"][0]["box"]
    assert box == [0, 0, 224, 224]  # 112 px of a 224 px view: half the 448 px original


def test_batch_mixes_depths_and_routes(scene):
    graph = build(small_agent(), depth=1)
    outs = graph.batch(
        [query(scene), query(scene)], config=[{}, {"configurable": {"speculation_depth": 0}}]
    )
    assert [o["route"] for o in outs] == ["speculative-tools", "judged-agentic"]


def test_answer_span_keeps_the_tokens_inside_the_tags():
    content = fake_logprobs(["<think>a</think>", "<ans", "wer>", "re", "d", "</answer>"], [9.0] * 6)
    kept = answer_span(content)["content"]
    assert [e["token"] for e in kept] == ["re", "d"]
    unterminated = fake_logprobs(["<answer>", "red"], [9.0, 9.0])  # the stop string was cut
    assert [e["token"] for e in answer_span(unterminated)["content"]] == ["red"]
    untagged = fake_logprobs(["red"], [9.0])
    assert answer_span(untagged) is untagged


def test_records_and_report_show_the_small_loop_and_alpha_depth(tmp_path, scene):
    """A depth-1 benchmark run: records keep the small loop's steps and score, the report adds
    alpha_D and the extended cost model beside the measured figures."""
    from speceyes_graph.benchmarks import (
        generate_suite,
        load_benchmark,
        read_records,
        run_benchmark,
    )
    from speceyes_graph.benchmarks.report import write_report

    data = generate_suite(tmp_path / "syn", 6, seed=2, max_side=640, progress=False)
    # every other answer of the small loop is sure (answers only: zoom turns in between vary)
    flip = itertools.cycle([9.0, 3.0])
    lock = threading.Lock()

    def alternate():
        with lock:
            return next(flip)

    sure = small_agent(answer_sep=alternate)
    graph = build(sure, deepeyes_agent(answer="A"), depth=1)
    run_benchmark(
        graph, load_benchmark("synthetic", data), tmp_path / "run", mode="speceyes", progress=False
    )
    records = read_records(tmp_path / "run")
    assert sorted(r["route"] for r in records) == ["judged-agentic"] * 3 + ["speculative-tools"] * 3
    tried = [r for r in records if r["tool_draft"]]
    assert len(tried) == 6 and all(len(r["tool_draft"]["steps"]) == 2 for r in tried)
    assert all(r["tool_draft"]["steps"][0]["tool_calls"][0]["box"] for r in tried)
    assert all(isinstance(r["tool_draft_correct"], bool) for r in tried)
    report = write_report(tmp_path / "run")
    s = report["summary"]
    accepted = sum(r["route"] == "speculative-tools" for r in records)
    assert s["alpha_depth"] == pytest.approx(accepted / 6) and s["speculation_depth"] == 1
    assert s["small_loop"]["queries"] == 6 and s["small_loop"]["mean_steps"] == 2.0
    cost = s["cost_model"]
    assert cost["c_small_loop_s"] > 0 and cost["l_agent_s"] > 0 and cost["expected_latency_s"] > 0
    md = (tmp_path / "run" / "report.md").read_text()
    assert "alpha_depth" in md and "expected_latency_s" in md and "E[L]" in md


@pytest.mark.parametrize("served", [False, True])
def test_thyme_small_loop_runs_its_code_in_the_sandbox(scene, served):
    """Depth-D under the Thyme protocol: the small model's program runs in the same OS
    sandbox, its output continues the small model's turn (a served small model is asked to
    continue it, as the agent is), the answer's tokens are gated."""
    from test_thyme import thyme_agent

    class Served(ScriptedChatModel):
        extra_body: dict | None = None

    written = thyme_agent()

    def respond(msgs):
        text = written.respond(msgs)
        if "<answer>" not in text:
            return text
        answer = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
        tokens = ["</think>", "<answer>", answer, "</answer>"]
        return AIMessage(
            content=text, response_metadata={"logprobs": fake_logprobs(tokens, [3.0, 9, 9, 9])}
        )

    small = (Served if served else ScriptedChatModel)(respond=respond)
    agent = thyme_agent()
    graph = create_speceyes_graph(
        judge=judge("yes"),
        speculator=small,
        agent=agent,
        tools="thyme",
        speculation=SpeculationOptions(depth=1),
    ).compile()
    out = graph.invoke({"question": "good: What is the color of the cup?", "images": [scene]})
    tool = out["tool_draft"]
    assert out["route"] == "speculative-tools", tool
    assert agent.calls == 0 and [t.strip() for t in tool["tokens"]] == [tool["text"]]
    call = tool["steps"][0]["tool_calls"][0]
    assert call["name"] == "python_sandbox" and call["error"] is None
    assert "crop.png" in call["stdout"] and tool["text"].startswith("1 image(s)")
    continued = [kw.get("extra_body") for kw in small.call_kwargs[1:]]
    if served:
        assert continued == [{"continue_final_message": True, "add_generation_prompt": False}]
    else:
        assert continued == [None]


def test_speceyes_tool_reports_the_small_loops_score(scene):
    """For another agent, the score is the gate's that decided: the small loop's answer."""
    from speceyes_graph import speceyes_tool

    tool = speceyes_tool(build(small_agent()))
    result = json.loads(tool.invoke({"question": "What colour is the dot?", "images": [scene]}))
    assert result["route"] == "speculative-tools" and result["answer"] == "red"
    assert result["score"] == pytest.approx(acceptance_score(9.0), rel=1e-6)
