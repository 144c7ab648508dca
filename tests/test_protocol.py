"""The published protocol, byte for byte: what each model is sent, checked against fixtures
taken from the SpecEyes evaluation scripts (tests/data/published_prompts.json)."""

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage

from helpers import deepeyes_agent, speculator
from speceyes_graph import LoopOptions, create_speceyes_graph
from speceyes_graph.messages import to_wire
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.protocol import message_text

PUBLISHED = json.loads((Path(__file__).parent / "data" / "published_prompts.json").read_text())


def texts(message):
    content = message.content if isinstance(message.content, list) else [message.content]
    return [
        b["text"] if isinstance(b, dict) else b
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    ]


def n_images(message):
    content = message.content if isinstance(message.content, list) else []
    return sum(1 for b in content if isinstance(b, dict) and b.get("type") == "image")


@pytest.mark.parametrize(
    "name, question, options",
    [
        ("vstar", "What is the color of the cup?", ["white", "black"]),
        ("pope", "Is there a dog in the image?", None),
    ],
)
def test_every_prompt_is_the_published_one(scene, name, question, options):
    judge = ScriptedChatModel(respond=lambda m: "no")
    small = speculator("A", 3.0)  # rejected: the agent runs too
    agent = deepeyes_agent()
    create_speceyes_graph(judge=judge, speculator=small, agent=agent).compile().invoke(
        {"question": question, "images": [scene], "options": options}
    )
    system, user = judge.received[0]
    assert system.content == PUBLISHED["judge_system"]  # with its final newline
    assert texts(user) == [PUBLISHED[f"judge_user_{name}"]] and n_images(user) == 1
    system, user = small.received[0]
    assert system.content == PUBLISHED["speculator_system"]
    assert texts(user) == [PUBLISHED[f"speculator_user_{name}"]] and n_images(user) == 1
    first, second = agent.received
    assert first[0].content == PUBLISHED["agent_system"]
    assert texts(first[1]) == [PUBLISHED[f"agent_user_{name}"]] and n_images(first[1]) == 1
    # the tool turn exactly as trained: <tool_response>, the crop, the instruction, no coordinates
    tool_turn = second[-1]
    assert tool_turn.type == "human" and texts(tool_turn) == PUBLISHED["tool_turn_texts"]
    assert n_images(tool_turn) == 1
    # each agent step stops at the end of a call or an answer
    published_stops = set(PUBLISHED["agent_stop_strings"]) - {"<|im_end|>"}  # <|im_end|> is EOS
    assert set(agent.call_kwargs[0]["stop"]) == published_stops


def test_the_tool_turn_renders_as_published_through_the_chat_template(tiny_chat, scene):
    """The Qwen2.5-VL chat template turns the wire messages into the published text, and the
    assistant turn keeps its closing tag although the stop string cut it off the reply."""
    agent = ScriptedChatModel(
        respond=lambda m: (
            AIMessage(
                content='<think>Look.</think>\n<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 50, 60]}}\n'
            )
            if len(m) == 2
            else "<answer>A</answer>"
        )
    )
    create_speceyes_graph(
        judge=ScriptedChatModel(respond=lambda m: "yes"), speculator=speculator(), agent=agent
    ).compile().invoke({"question": "q", "images": [scene]})
    from speceyes_graph.models import to_hf_messages

    wire = agent.received[1]
    hf, _ = to_hf_messages(wire)
    rendered = tiny_chat["large"].processor.apply_chat_template(
        hf, add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith(PUBLISHED["tool_turn_rendered_qwen25vl"])
    assert "}}\n</tool_call><|im_end|>" in rendered


def test_improvements_are_options(scene):
    agent = deepeyes_agent()
    create_speceyes_graph(
        judge=ScriptedChatModel(respond=lambda m: "yes"), speculator=speculator(), agent=agent,
        loop=LoopOptions(tool_response_text=True, stop=()),
    ).compile().invoke({"question": "q", "images": [scene]})  # fmt: skip
    tool_turn = agent.received[1][-1]
    assert any("region" in t and "of the original image" in t for t in texts(tool_turn))
    assert agent.call_kwargs[0].get("stop") is None


def test_the_published_step_limit_is_an_error(scene):
    never = ScriptedChatModel(
        respond=lambda m: (
            '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 50, 50]}}</tool_call>'
        )
    )
    build = lambda **kw: create_speceyes_graph(  # noqa: E731
        judge=ScriptedChatModel(respond=lambda m: "no"),
        speculator=speculator("A", 3.0),
        agent=never,
        **kw,
    ).compile()
    ours = build().invoke({"question": "q", "images": [scene]})
    assert ours["answer"] == "A" and ours["stop_reason"] == "step_limit, answered with the draft"
    published = build(loop=LoopOptions(on_step_limit="error")).invoke(
        {"question": "q", "images": [scene]}
    )
    assert published["answer"] is None and published["stop_reason"] == "step_limit"
    assert "no answer after 6 steps" in published["error"] and len(published["agent_steps"]) == 6


def test_the_demo_keeps_the_format_it_was_trained_on():
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS

    prompts = DEMO_GRAPH_SETTINGS["prompts"]
    assert prompts.judge_system == PUBLISHED["judge_system"].rstrip("\n")
    assert prompts.question("What?", ["a", "b"]) == "Question: What?\nOptions: \nA. a\nB. b\n"
    assert DEMO_GRAPH_SETTINGS["loop"].tool_response_text


def test_closing_tags_are_restored_in_the_history():
    wire = to_wire(
        [AIMessage(content="<think>x</think><tool_call>\n{}\n"), AIMessage(content="<answer>B")],
        "deepeyes",
    )
    assert [message_text(m) for m in wire] == [
        "<think>x</think><tool_call>\n{}\n</tool_call>",
        "<answer>B</answer>",
    ]
