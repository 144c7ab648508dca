"""The demo world and training data: rendered exactly as the graph renders at inference."""

import numpy as np
import pytest
from langchain_core.messages import AIMessage
from PIL import Image

from speceyes_graph import create_speceyes_graph
from speceyes_graph.demo import DEMO_GRAPH_SETTINGS
from speceyes_graph.models import ScriptedChatModel, fake_logprobs, to_hf_messages
from speceyes_graph.protocol import parse_deepeyes
from speceyes_graph.training import (
    COLOURS,
    DEMO_PROMPTS,
    LARGE_SPEC,
    SMALL_SPEC,
    build_demo_processor,
    cell_bbox,
    collate,
    conversations,
    encode,
    make_scene,
)


@pytest.fixture(scope="module")
def processors():
    return {k: build_demo_processor(k) for k in ("small", "large")}


def test_scenes(processors):
    rng = np.random.default_rng(0)
    for small in (True, False) * 10:
        s = make_scene(rng, small)
        x1, y1, x2, y2 = s.box
        assert tuple(s.image[(y1 + y2) // 2, (x1 + x2) // 2]) == COLOURS[s.colour]
        assert abs(int(s.image[0, 0, 0]) - int(s.image[0, -1, 0])) >= 18  # the position ramp
        assert ((x2 - x1) <= 16) == small and sorted(s.options) == sorted(COLOURS)
        if small:  # the object lies inside the cell the tool call will name
            bx1, by1, bx2, by2 = (v * 1024 // 112 for v in cell_bbox(s.cell))
            assert bx1 <= x1 and x2 <= bx2 and by1 <= y1 and y2 <= by2


def test_training_prompts_match_what_the_graph_sends(processors, tmp_path):
    """Run the real graph with scripted models that record their prompts; compare renderings."""
    rng = np.random.default_rng(3)
    scene = make_scene(rng, small=True)
    path = tmp_path / "scene.png"
    Image.fromarray(scene.image).save(path)
    convs = conversations(scene)
    seen = {}

    def large(messages):
        text = "".join(str(m.content) for m in messages)
        if "Would tools significantly improve" in text:
            seen["judge"] = messages
            return "yes"
        if "<tool_response>" in str(messages[-1].content):
            seen["after_zoom"] = messages
            return convs["after_zoom"][2]
        seen["zoom"] = messages
        return convs["zoom"][2]

    def small(messages):
        seen["draft"] = messages
        return AIMessage(
            content="red", response_metadata={"logprobs": fake_logprobs(["red"], [3.0])}
        )

    large_judge = ScriptedChatModel(respond=lambda m: "no")  # first pass: the draft path
    create_speceyes_graph(
        judge=large_judge,
        speculator=ScriptedChatModel(respond=small),
        agent=ScriptedChatModel(respond=large),
        prompts=DEMO_PROMPTS,
        loop=DEMO_GRAPH_SETTINGS["loop"],
        resize=LARGE_SPEC,
        speculator_resize=SMALL_SPEC,
        max_agent_steps=1,
    ).compile().invoke(
        {
            "question": "What is the color of the object?",
            "images": [str(path)],
            "options": scene.options,
        }
    )
    graph = create_speceyes_graph(
        judge=ScriptedChatModel(respond=large),
        speculator=ScriptedChatModel(respond=small),
        agent=ScriptedChatModel(respond=large),
        prompts=DEMO_PROMPTS,
        loop=DEMO_GRAPH_SETTINGS["loop"],
        resize=LARGE_SPEC,
        speculator_resize=SMALL_SPEC,
        speculator_as_judge=False,
    )
    out = graph.compile().invoke(
        {
            "question": "What is the color of the object?",
            "images": [str(path)],
            "options": scene.options,
        }
    )
    assert out["answer"] == scene.colour and out["agent_steps"][0]["tool_calls"][0]["box"] == [
        scene.cell[1] * 256,
        scene.cell[0] * 256,
        scene.cell[1] * 256 + 256,
        scene.cell[0] * 256 + 256,
    ]
    for task in ("draft", "judge", "zoom", "after_zoom"):
        from speceyes_graph.messages import to_wire

        wire = to_wire(seen[task], "deepeyes", DEMO_PROMPTS.tool_response_instruction, True)
        hf, images = to_hf_messages(wire)
        proc = processors["small" if task == "draft" else "large"]
        expected_msgs, expected_images, _ = convs[task]
        assert proc.apply_chat_template(
            hf, add_generation_prompt=True, tokenize=False
        ) == proc.apply_chat_template(expected_msgs, add_generation_prompt=True, tokenize=False)
        assert len(images) == len(expected_images)
        for a, b in zip(images, expected_images, strict=True):
            assert a.shape == b.shape and np.array_equal(
                a, b
            )  # same pixels: resize and crop paths agree
    parsed = parse_deepeyes(convs["zoom"][2], {"image_zoom_in_tool"})
    assert parsed.tool_calls[0]["args"]["bbox_2d"] == cell_bbox(scene.cell)


def test_encode_and_collate(processors):
    proc = processors["large"]
    scene = make_scene(np.random.default_rng(1), small=True)
    convs = conversations(scene)
    samples = [encode(proc, *c) for c in convs.values()]
    batch = collate(samples, proc.tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == len(samples)
    labelled = (batch["labels"] != -100).sum(dim=1)
    assert all(n > 0 for n in labelled.tolist())  # only the reply is trained
    after_zoom = samples[list(convs).index("after_zoom")]
    reply = proc.tokenizer.decode([t for t in after_zoom["labels"].tolist() if t != -100])
    assert reply.startswith("<think>") and scene.colour in reply
