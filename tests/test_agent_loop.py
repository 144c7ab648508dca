import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import LoopOptions, create_speceyes_graph
from speceyes_graph.messages import to_wire
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.prompts import DEEPEYES_USER_PROMPT
from speceyes_graph.protocol import extract_answer, message_text, parse_deepeyes

TOOLS = {"image_zoom_in_tool"}


def call(args, name="image_zoom_in_tool"):
    return json.dumps({"name": name, "arguments": args})


# --- parsing the DeepEyes text protocol -------------------------------------------------------------


def test_parse_one_call():
    t = parse_deepeyes(
        f"<think>hmm</think><tool_call>\n{call({'bbox_2d': [1, 2, 3, 4]})}\n</tool_call>", TOOLS
    )
    assert t.answer is None and not t.problems
    assert t.tool_calls[0]["name"] == "image_zoom_in_tool" and t.tool_calls[0]["args"] == {
        "bbox_2d": [1, 2, 3, 4]
    }
    assert t.tool_calls[0]["id"].startswith("call_")


def test_parse_missing_closing_tags():
    t = parse_deepeyes(f"<tool_call>{call({'bbox_2d': [1, 2, 3, 4]})}", TOOLS)  # stop string ate it
    assert len(t.tool_calls) == 1
    assert parse_deepeyes("<think>ok</think><answer>B", TOOLS).answer == "B"
    assert extract_answer("<answer> red </answer> trailing") == "red"


def test_parse_several_calls():
    text = f"<tool_call>{call({'bbox_2d': [1, 2, 3, 4]})}</tool_call><tool_call>{call({'bbox_2d': [5, 6, 7, 8]})}</tool_call>"
    t = parse_deepeyes(text, TOOLS)
    assert [c["args"]["bbox_2d"] for c in t.tool_calls] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert len({c["id"] for c in t.tool_calls}) == 2


def test_parse_malformed_and_unknown():
    t = parse_deepeyes(
        "<tool_call>{'name': 'image_zoom_in_tool', 'arguments': {}}</tool_call>", TOOLS
    )
    assert not t.tool_calls and t.problems[0].startswith("Error: Invalid tool call format")
    t = parse_deepeyes(f"<tool_call>{call({'x': 1}, name='rm_rf')}</tool_call>", TOOLS)
    assert not t.tool_calls and "Unknown tool name: rm_rf" in t.problems[0]
    t = parse_deepeyes('<tool_call>{"name": "image_zoom_in_tool"}</tool_call>', TOOLS)
    assert t.tool_calls[0]["args"] == {}  # no arguments: the tool's validation will answer
    t = parse_deepeyes(
        '<tool_call>{"name": "image_zoom_in_tool", "arguments": "{\\"bbox_2d\\": [1,2,3,4]}"}</tool_call>',
        TOOLS,
    )
    assert t.tool_calls[0]["args"] == {"bbox_2d": [1, 2, 3, 4]}  # double-encoded arguments
    t = parse_deepeyes(
        f"<tool_call>```json\n{call({'bbox_2d': [1, 2, 3, 4]})}\n```</tool_call>", TOOLS
    )
    assert len(t.tool_calls) == 1  # fenced JSON
    t = parse_deepeyes(f"<tool_call>{call({'bbox_2d': [1, 2, 3, 4]})}}}</tool_call>", TOOLS)
    assert len(t.tool_calls) == 1  # trailing junk after the object


def test_answer_wins_and_think_is_not_a_call():
    t = parse_deepeyes(
        f"<tool_call>{call({'bbox_2d': [1, 2, 3, 4]})}</tool_call><answer>C</answer>", TOOLS
    )
    assert t.answer == "C" and not t.tool_calls
    t = parse_deepeyes(
        f"<think>I could <tool_call>{call({'bbox_2d': [1, 2, 3, 4]})}</tool_call></think>nothing",
        TOOLS,
    )
    assert not t.tool_calls


# --- wire rendering -------------------------------------------------------------------------------


def transcript():
    ai = AIMessage(
        content="<think>x</think>",
        tool_calls=[{"name": "zoom", "args": {"bbox": [1, 2, 3, 4]}, "id": "c1"}],
    )
    tm = ToolMessage(
        content=[
            {"type": "text", "text": "zoomed"},
            {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
        ],
        tool_call_id="c1",
        name="zoom",
    )
    return [HumanMessage(content="q"), ai, tm]


def test_deepeyes_wire_sends_the_crop_as_a_user_turn():
    wire = to_wire(transcript(), "deepeyes", "INSTRUCTION")
    assert [m.type for m in wire] == ["human", "ai", "human"]
    assert "<tool_call>" in wire[1].content and not wire[1].tool_calls  # text protocol
    parts = wire[2].content
    assert parts[0]["text"] == "<tool_response>" and parts[-1]["text"] == "</tool_response>"
    assert parts[-2]["text"] == "INSTRUCTION" and any(p["type"] == "image" for p in parts)


def test_native_wire_keeps_images_out_of_tool_messages():
    wire = to_wire(transcript(), "native")
    assert [m.type for m in wire] == ["human", "ai", "tool", "human"]
    assert wire[2].content == "zoomed" and wire[1].tool_calls
    assert wire[3].content[1]["type"] == "image"


# --- the loop, end to end through the graph -----------------------------------------------------------


def test_deepeyes_model_drives_the_loop_end_to_end(scene):
    # scene: 1280x720 with a red square at (100,100)-(200,200); the model sees 1288x728
    agent = deepeyes_agent(bbox=(95, 95, 210, 210), answer="A")
    out = (
        create_speceyes_graph(judge=judge("yes"), speculator=speculator(), agent=agent)
        .compile()
        .invoke(
            {
                "question": "What colour is the square?",
                "images": [scene],
                "options": ["red", "blue"],
            }
        )
    )
    assert out["answer"] == "A" and out["stop_reason"] == "answered"
    step1, step2 = out["agent_steps"]
    tc = step1["tool_calls"][0]
    assert tc["name"] == "image_zoom_in_tool" and tc["error"] is None and tc["latency_s"] > 0
    x1, y1, x2, y2 = tc["box"]  # box after mapping to the original and clamping
    assert abs(x1 - 94) <= 1 and abs(x2 - 209) <= 1 and abs(y1 - 94) <= 1 and abs(y2 - 208) <= 1
    assert step2["answer"] == "A" and step1["model_latency_s"] >= 0
    stored = out["agent_messages"]  # the transcript in state: no system prompt, no pixels
    assert [m.type for m in stored] == ["human", "ai", "tool", "ai"]
    assert "Think first, call **image_zoom_in_tool**" in message_text(stored[0])
    sent = agent.received[-1]  # what the model got: system prompt first, images inline
    assert sent[0].type == "system" and "image_zoom_in_tool" in sent[0].content
    assert [m.type for m in sent] == ["system", "human", "ai", "human"]
    assert any(b.get("base64") for b in sent[-1].content if isinstance(b, dict))


def test_native_tool_calling_model(scene):
    seen = []

    def respond(msgs):
        seen.append([m.type for m in msgs])
        if (
            msgs[-1].type == "human"
            and any(isinstance(b, dict) and b.get("type") == "image" for b in msgs[-1].content)
            and len(msgs) > 2
        ):
            return AIMessage(content="<answer>red</answer>")
        return AIMessage(
            content="",
            tool_calls=[{"name": "zoom", "args": {"bbox": [90, 90, 210, 210]}, "id": "z1"}],
        )

    agent = ScriptedChatModel(respond=respond)
    out = (
        create_speceyes_graph(
            judge=judge("yes"), speculator=speculator(), agent=agent, tools="vision"
        )
        .compile()
        .invoke({"question": "What colour is the square?", "images": [scene]})
    )
    assert out["answer"] == "red"
    assert [t.name for t in agent.bound_tools] == ["crop", "zoom", "ocr"]
    assert seen[1] == ["system", "human", "ai", "tool", "human"]  # image after the tool message
    assert out["agent_steps"][0]["tool_calls"][0]["box"][0] in (89, 90)


@pytest.mark.parametrize("explain", [False, True])
def test_malformed_call_gets_a_corrective_message_and_the_loop_goes_on(scene, explain):
    prompts_seen = []

    def respond(msgs):
        prompts_seen.append(message_text(msgs[-1]))
        if len(prompts_seen) == 1:
            return "<tool_call>{bbox_2d: [1,2,3,4]}</tool_call>"
        if len(prompts_seen) == 2:
            return f"<tool_call>{call({'bbox_2d': [1, 2, 3, 4]}, name='magnify')}</tool_call>"
        if len(prompts_seen) == 3:
            return "I am thinking out loud without tags"
        return "<answer>B</answer>"

    out = (
        create_speceyes_graph(
            judge=judge("yes"),
            speculator=speculator(),
            agent=ScriptedChatModel(respond=respond),
            loop=LoopOptions(explain_problems=explain),
        )
        .compile()
        .invoke({"question": "q?", "images": [scene]})
    )
    assert out["answer"] == "B" and len(out["agent_steps"]) == 4
    if explain:  # our improvement: say what was wrong
        assert "Invalid tool call format" in prompts_seen[1]
        assert "Unknown tool name: magnify" in prompts_seen[2]
        assert "Think first" in prompts_seen[3]
    else:  # the published loop repeats the instruction, nothing else
        assert prompts_seen[1:] == [DEEPEYES_USER_PROMPT] * 3
    # either way the trace records every problem
    assert [s["problem"] is not None for s in out["agent_steps"]] == [True, True, True, False]
    assert "Invalid tool call format" in out["agent_steps"][0]["problem"]


def test_bad_box_is_answered_by_the_tool_and_the_loop_continues(scene):
    def respond(msgs):
        if "<tool_response>" in message_text(msgs[-1]):
            assert "zero area" in message_text(msgs[-1])
            return "<answer>A</answer>"
        return f"<tool_call>{call({'bbox_2d': [5000, 5000, 6000, 6000]})}</tool_call>"

    out = (
        create_speceyes_graph(
            judge=judge("yes"), speculator=speculator(), agent=ScriptedChatModel(respond=respond)
        )
        .compile()
        .invoke({"question": "q?", "images": [scene]})
    )
    assert out["answer"] == "A" and "zero area" in out["agent_steps"][0]["tool_calls"][0]["error"]


@pytest.mark.parametrize("with_draft", [True, False])
def test_step_bound(scene, with_draft):
    agent = ScriptedChatModel(
        respond=lambda msgs: f"<tool_call>{call({'bbox_2d': [10, 10, 100, 100]})}</tool_call>"
    )
    g = create_speceyes_graph(
        judge=judge("no" if with_draft else "yes"),
        speculator=speculator("A", 3.0),
        agent=agent,
        loop=LoopOptions(max_steps=3),
    ).compile()
    out = g.invoke({"question": "q?", "images": [scene]})
    assert len(out["agent_steps"]) == 3 and agent.calls == 3
    if with_draft:
        assert out["answer"] == "A" and out["stop_reason"] == "step_limit, answered with the draft"
    else:
        assert out["answer"] is None and out["stop_reason"] == "step_limit, no answer"


def test_user_defined_tool_in_native_protocol(scene):
    @tool
    def count_pixels(threshold: int) -> str:
        """Count bright pixels."""
        return f"{threshold * 2} pixels"

    def respond(msgs):
        if msgs[-1].type == "tool":
            return AIMessage(content=f"<answer>{msgs[-1].content}</answer>")
        return AIMessage(
            content="", tool_calls=[{"name": "count_pixels", "args": {"threshold": 21}, "id": "t1"}]
        )

    out = (
        create_speceyes_graph(
            judge=judge("yes"),
            speculator=speculator(),
            agent=ScriptedChatModel(respond=respond),
            tools=[count_pixels],
        )
        .compile()
        .invoke({"question": "q?", "images": [scene]})
    )
    assert out["answer"] == "42 pixels"
