"""The Thyme protocol end to end: the published prompts, code in the OS sandbox, the
sandbox's output inside the same assistant turn, and good, failing and malicious code in
one ``graph.batch``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from helpers import judge, question_of, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_graph.messages import to_wire
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.prompts import THYME_SYSTEM_PROMPT, Prompts
from speceyes_graph.protocol import message_text, parse_thyme
from speceyes_tools import default_store

PUBLISHED = json.loads(
    (Path(__file__).parent / "data" / "published_thyme_prompts.json").read_text()
)

CROP = """```python
from PIL import Image
image_path = "/data/somewhere/else.jpg"
image = Image.open(image_path)
x1, y1, x2, y2 = 90, 90, 210, 5000
crop = image.crop((x1, y1, x2, y2))
processed_path = "/mnt/data/temp_processed_images/crop.png"
crop.save(processed_path)
print(processed_path)
```"""
PROGRAMS = {
    "good": CROP,
    "failing": "```python\nraise ValueError('bad luck')\n```",
    "malicious": "```python\nimport socket, os\nprint(open('/etc/passwd').read())\n```",
    "forking": "```python\nimport os\nwhile True:\n    os.fork()\n```",
    "printing": "```python\nprint(6 * 7)\n```",
}


def thyme_agent():
    """Writes the program its question names, then answers with what the sandbox said."""

    def respond(msgs):
        last = msgs[-1]
        if isinstance(last, AIMessage):  # continuing its own turn after <sandbox_output>
            blocks = last.content if isinstance(last.content, list) else [last.content]
            images = sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "image")
            said = message_text(last).rsplit("<sandbox_output>", 1)[-1]
            said = said.replace("</sandbox_output>", "").strip().splitlines()
            return f"</think><answer>{images} image(s); {said[0][:60] if said else ''}</answer>"
        program = next(p for name, p in PROGRAMS.items() if name in question_of(msgs))
        return f"<think>Let me look closer.\n<code>\n{program}\n"

    return ScriptedChatModel(respond=respond)


def build(**kw):
    return create_speceyes_graph(
        judge=judge("yes"),
        speculator=speculator("A"),
        agent=kw.pop("agent", thyme_agent()),
        tools="thyme",
        **kw,
    ).compile()


def test_the_published_thyme_prompts_are_sent(scene):
    agent = thyme_agent()
    graph = create_speceyes_graph(
        judge=judge("no"),
        speculator=speculator("A", separability=-5.0),  # rejected: the agent runs too
        agent=agent,
        tools="thyme",
        prompts=Prompts.thyme(open_tail="Please answer 'yes' or 'no'."),
    ).compile()
    out = graph.invoke({"question": "good: What is the color of the cup?", "images": [scene],
                        "options": ["white", "black"]})  # fmt: skip
    assert out["route"] == "rejected-agentic", out.get("error")
    system, user = agent.received[0][:2]
    assert isinstance(system, SystemMessage) and system.content == PUBLISHED["thyme_system"]
    expected = PUBLISHED["thyme_user_vstar"].replace("What is", "good: What is")
    expected = expected.replace("{IMAGE_PATH}", "/mnt/data/images/scene.png")
    expected = expected.replace("400x300", "1280x720")
    assert message_text(user) == expected
    assert user.content[0]["type"] == "image"  # the image first, then the text
    assert agent.call_kwargs[0]["stop"] == PUBLISHED["thyme_stop_strings"]


def test_thyme_question_blocks_match_the_published_judge_and_draft_prompts():
    prompts = Prompts.thyme(open_tail="Please answer 'yes' or 'no'.")
    q, opts = "What is the color of the cup?", ["white", "black"]
    assert prompts.question(q, opts) + prompts.judge_suffix == PUBLISHED["judge_user_vstar"]
    assert (
        prompts.question(q, opts) + prompts.speculator_suffix == PUBLISHED["speculator_user_vstar"]
    )
    pope = "Is there a dog in the image?"
    assert prompts.question(pope) + prompts.judge_suffix == PUBLISHED["judge_user_pope"]
    assert prompts.question(pope) + prompts.speculator_suffix == PUBLISHED["speculator_user_pope"]
    assert prompts.verify == PUBLISHED["specreason_verify"]


def test_thyme_defaults_tau_095_and_five_steps(scene):
    # sigmoid(0.6 * 5.5) = 0.964: kept at Thyme's tau 0.95, rejected at DeepEyes' 0.98
    query = {"question": "printing", "images": [scene]}
    thyme = create_speceyes_graph(
        judge=judge("no"), speculator=speculator("A", 5.5), agent=thyme_agent(), tools="thyme"
    ).compile()
    assert thyme.invoke(query)["route"] == "speculative"
    deepeyes = create_speceyes_graph(
        judge=judge("no"), speculator=speculator("A", 5.5), agent=thyme_agent()
    ).compile()
    assert deepeyes.invoke(query)["route"] == "rejected-agentic"
    always_code = ScriptedChatModel(respond=lambda msgs: "<code>\nprint(1)\n")
    out = build(agent=always_code).invoke(query)
    assert always_code.calls == 5 and len(out["agent_steps"]) == 5
    assert out["stop_reason"].startswith("step_limit")


def test_parse_thyme_extracts_the_first_code_block_without_its_closing_tag():
    turn = parse_thyme("<think>hm</think>\n<code>\n```python\nprint(1)\n```\n")
    assert [c["args"]["code"] for c in turn.tool_calls] == ["print(1)"]
    turn = parse_thyme("<code>print(2)</code> and <code>print(3)</code>")
    assert [c["args"]["code"] for c in turn.tool_calls] == ["print(2)"]
    assert parse_thyme("<answer>B</answer><code>print(1)</code>").answer == "B"
    assert parse_thyme("just talking").problems == ["no <code> and no <answer>"]
    assert parse_thyme("<code>```python\n```</code>").problems == ["an empty <code> block"]


def test_sandbox_output_continues_the_same_assistant_turn():
    key = default_store().put_array(np.zeros((8, 8, 3), np.uint8))
    wire = to_wire(
        [
            HumanMessage(content="q"),
            AIMessage(content="<think>x\n<code>\nprint(1)\n```\n",
                      tool_calls=[{"name": "python_sandbox", "args": {"code": "print(1)"}, "id": "1"}]),
            ToolMessage(content=[{"type": "image", "url": key}], tool_call_id="1"),
            AIMessage(content="more", tool_calls=[{"name": "python_sandbox", "args": {"code": "1"}, "id": "2"}]),
            ToolMessage(content="42", tool_call_id="2"),
        ],
        "thyme",
    )  # fmt: skip
    assert [m.type for m in wire] == ["human", "ai"]
    texts = [b.get("text") if b["type"] == "text" else "<IMG>" for b in wire[1].content]
    assert texts == [
        "<think>x\n<code>\nprint(1)\n```\n</code>", "<sandbox_output>", "<IMG>",
        "</sandbox_output>", "more", "<sandbox_output>", "42", "</sandbox_output>",
    ]  # fmt: skip


def test_good_failing_and_malicious_code_in_one_batch(scene):
    graph = build()
    names = ["good", "failing", "malicious", "forking", "printing"]
    outs = graph.batch([{"question": f"{n}: what is red?", "images": [scene]} for n in names])
    by = dict(zip(names, outs, strict=True))
    for name, out in by.items():
        assert out["route"] == "judged-agentic", (name, out.get("error"))
        assert out.get("error") is None, (name, out["error"])  # code errors go to the model
        [step, last] = out["agent_steps"]
        [call] = step["tool_calls"]
        assert call["name"] == "python_sandbox" and call["latency_s"] > 0
        assert last["answer"] == out["answer"]
    good = by["good"]["agent_steps"][0]["tool_calls"][0]
    assert good["error"] is None and len(good["images"]) == 1
    crop = default_store().get(good["images"][0])
    assert crop.shape == (720 - 90, 120, 3)  # the box clamped to the original image
    assert "x1, y1, x2, y2 = (90, 90, 210, 720)" in good["code"]
    assert "image_path = '/mnt/data/images/scene.png'" in good["code"]  # the path rewritten
    assert by["good"]["answer"].startswith("1 image(s)")
    failing = by["failing"]["agent_steps"][0]["tool_calls"][0]
    assert "ValueError: bad luck" in failing["error"]
    assert by["failing"]["answer"].startswith("0 image(s); Error:")
    evil = by["malicious"]["agent_steps"][0]["tool_calls"][0]
    assert "No such file or directory: '/etc/passwd'" in evil["error"]
    assert "root:" not in json.dumps(by["malicious"], default=str)
    fork = by["forking"]["agent_steps"][0]["tool_calls"][0]
    assert "Operation not permitted" in fork["error"]
    assert by["printing"]["agent_steps"][0]["tool_calls"][0]["stdout"].strip() == "42"


def test_no_code_and_no_answer_ends_the_loop_as_published(scene):
    agent = ScriptedChatModel(respond=lambda msgs: "I think it is red.")
    out = build(agent=agent).invoke({"question": "good", "images": [scene]})
    assert out["stop_reason"] == "no code and no answer"
    assert agent.calls == 1 and out["answer"] is None


def test_a_served_model_is_asked_to_continue_its_turn(scene):
    class Served(ScriptedChatModel):
        extra_body: dict | None = None

    agent = Served(respond=thyme_agent().respond)
    build(agent=agent).invoke({"question": "printing", "images": [scene]})
    assert "extra_body" not in agent.call_kwargs[0]
    assert agent.call_kwargs[1]["extra_body"] == {
        "continue_final_message": True,
        "add_generation_prompt": False,
    }


def test_thyme_agent_system_prompt_default():
    assert Prompts.thyme().agent_system == THYME_SYSTEM_PROMPT


@pytest.mark.parametrize("family", ["large"])
def test_tiny_checkpoint_continues_the_assistant_turn(tiny_chat, scene, family):
    """The local model renders the merged turn and continues it (no new assistant header)."""
    model = tiny_chat[family]
    msgs = [
        HumanMessage(content=[{"type": "text", "text": "q"}]),
        AIMessage(content=[{"type": "text", "text": "<code>print(1)</code>"},
                           {"type": "text", "text": "<sandbox_output>"},
                           {"type": "text", "text": "1"},
                           {"type": "text", "text": "</sandbox_output>"}]),
    ]  # fmt: skip
    prepared = model._prepare(msgs)
    text = model._processor.tokenizer.decode(prepared["inputs"]["input_ids"][0])
    assert text.endswith("<code>print(1)</code><sandbox_output>1</sandbox_output>")
    reply = model.invoke(msgs)
    assert isinstance(reply.content, str)


def test_thyme_over_http_continues_the_assistant_turn_with_the_crop_inside(scene):
    """The real ChatOpenAI client against a vLLM-format replay server: the second request
    ends in the assistant turn (code, <sandbox_output>, the crop as an image part) and asks
    the server to continue it."""
    pytest.importorskip("langchain_openai", reason="the openai extra")
    from vllm_replay import ReplayServer, completion

    from speceyes_graph.models import openai_chat_model

    def respond(body):
        last = body["messages"][-1]
        if last["role"] == "assistant":
            return 200, completion(body["model"], "</think><answer>red</answer>"), 0
        return 200, completion(body["model"], "<think>zoom\n<code>\n" + CROP + "\n"), 0

    with ReplayServer(respond) as server:
        graph = create_speceyes_graph(
            agent=openai_chat_model(server.url, "thyme"), tools="thyme", mode="agent"
        ).compile()
        out = graph.invoke({"question": "what is red?", "images": [scene]})
    assert out["answer"] == "red", out
    first, second = server.requests
    assert first["stop"] == ["</code>", "</answer>"] and "continue_final_message" not in first
    assert second["continue_final_message"] is True and second["add_generation_prompt"] is False
    turn = second["messages"][-1]
    assert turn["role"] == "assistant"
    kinds = [p["type"] for p in turn["content"]]
    assert kinds == ["text", "text", "image_url", "text"]
    assert turn["content"][0]["text"].endswith("```\n</code>")
    assert [turn["content"][i]["text"] for i in (1, 3)] == ["<sandbox_output>", "</sandbox_output>"]


def test_the_sandbox_gets_the_original_file_under_its_own_name(tmp_path):
    """As the published harness runs the code on the dataset's file: the same bytes (no
    re-encoding), the file's own name, the original size in the prompt."""
    import hashlib

    from PIL import Image

    from speceyes_tools import make_python_sandbox_tool

    path = tmp_path / "sa_4690.jpg"
    Image.new("RGB", (333, 222), (10, 200, 30)).save(path, quality=80)
    tool = make_python_sandbox_tool()
    code = (
        "import hashlib, os\n"
        "print(os.path.basename(image_path), hashlib.sha256(open(image_path, 'rb').read()).hexdigest())\n"
        "print(Image.open(image_path).size)"
    )
    out = tool.invoke({"code": code, "state": {"images": [str(path)]}})
    name, digest, size = out.replace("\n", " ").split(" ", 2)
    assert name == "sa_4690.jpg"
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert size == "(333, 222)"


def test_other_formats_reach_the_sandbox_as_png_under_the_name_the_prompt_gives(tmp_path):
    from PIL import Image

    from speceyes_tools import make_python_sandbox_tool
    from speceyes_tools.python_tool import sandbox_image_path

    path = tmp_path / "scan.bmp"
    Image.new("RGB", (50, 40), (1, 2, 3)).save(path)
    assert sandbox_image_path(str(path)) == ("/mnt/data/images/scan.png", (50, 40))
    code = "import os\nprint(os.path.basename(image_path), Image.open(image_path).format)"
    out = make_python_sandbox_tool().invoke({"code": code, "state": {"images": [str(path)]}})
    assert out.split() == ["scan.png", "PNG"]


def test_thyme_on_a_reused_thread_starts_clean_and_keeps_no_pixels(scene):
    from langgraph.checkpoint.memory import InMemorySaver

    graph = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator("A"), agent=thyme_agent(), tools="thyme"
    ).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    first = graph.invoke({"question": "good: what is red?", "images": [scene]}, config)
    second = graph.invoke({"question": "printing: what is red?", "images": [scene]}, config)
    assert first["answer"].startswith("1 image(s)")
    assert second["answer"].startswith("0 image(s); 42")
    [call] = second["agent_steps"][0]["tool_calls"]
    assert "print(6 * 7)" in call["code"] and call["images"] == []
    stored = json.dumps(graph.get_state(config).values, default=str)
    assert "base64" not in stored and "iVBOR" not in stored  # crops are blob:// references
    assert "blob://" in stored
