"""The demo world and training data: rendered exactly as the graph renders at inference."""

import dataclasses

import numpy as np
import pytest
from langchain_core.messages import AIMessage
from PIL import Image

from speceyes_graph import SpeculationOptions, create_speceyes_graph
from speceyes_graph.demo import DEMO_GRAPH_SETTINGS
from speceyes_graph.demo.training import (
    build_demo_processor,
    collate,
    encode,
    evaluate,
    held_out_scenes,
)
from speceyes_graph.demo.world import (
    COLOURS,
    DEMO_PROMPTS,
    EDGES,
    LARGE_SPEC,
    REGIONS,
    SMALL_SPEC,
    conversations,
    make_scene,
    region_box,
    tool_call_text,
    view,
)
from speceyes_graph.messages import to_wire
from speceyes_graph.models import ScriptedChatModel, fake_logprobs, to_hf_messages
from speceyes_graph.protocol import parse_deepeyes
from speceyes_tools.vision import resolve_box


@pytest.fixture(scope="module")
def processors():
    return {k: build_demo_processor(k) for k in ("small", "large")}


def _inside(box, region):
    r, c = region
    x1, y1, x2, y2 = box
    return EDGES[c] <= x1 and x2 <= EDGES[c + 1] and EDGES[r] <= y1 and y2 <= EDGES[r + 1]


def test_scenes():
    rng = np.random.default_rng(0)
    for tiny in (True, False) * 20:
        s = make_scene(rng, tiny)
        x1, y1, x2, y2 = s.box
        assert tuple(s.image[(y1 + y2) // 2, (x1 + x2) // 2]) == COLOURS[s.colour]
        assert abs(int(s.image[0, 0, 0]) - int(s.image[0, -1, 0])) >= 18  # the position ramp
        assert ((x2 - x1) <= 16) == tiny and sorted(s.options) == sorted(COLOURS)
        assert _inside(s.box, s.region) and s.region_name in s.question
        # the zoom box the agent is taught covers the target's region, in original pixels
        box = resolve_box(region_box(s.region), s.image, "model", LARGE_SPEC).as_list()
        assert box[0] <= x1 and box[1] <= y1 and x2 <= box[2] and y2 <= box[3]
        # three distractor dots elsewhere; in tiny scenes they carry the three other colours
        present = {c for c, rgb in COLOURS.items() if (s.image == rgb).all(axis=-1).any()}
        assert present == set(COLOURS) if tiny else s.colour in present
        r0, c0 = s.region
        inside = s.image[EDGES[r0] : EDGES[r0 + 1], EDGES[c0] : EDGES[c0 + 1]]
        others = {c for c, rgb in COLOURS.items() if (inside == rgb).all(axis=-1).any()}
        assert others == {s.colour}  # the crop shows the target alone


def test_tiny_targets_are_small_in_the_models_views():
    """What the demo world claims: a tiny target is a dot at the models' input, a large one
    a blob, and the zoomed crop shows the tiny target three times larger."""
    from speceyes_graph.demo.world import zoomed_crop

    rng = np.random.default_rng(5)
    for tiny in (True, False) * 5:
        s = make_scene(rng, tiny)
        full = view(s.image, SMALL_SPEC).astype(int)  # 128 px: 8 original pixels per pixel
        bg = np.median(full.reshape(-1, 3), axis=0)
        r, c = s.region
        region = full[EDGES[r] // 8 : EDGES[r + 1] // 8, EDGES[c] // 8 : EDGES[c + 1] // 8]
        marked = (np.abs(region - bg).sum(-1) > 60).sum()
        crop = view(zoomed_crop(s)[0], LARGE_SPEC).astype(int)  # 112 px of a 338 px region
        in_crop = (np.abs(crop - bg).sum(-1) > 60).sum()
        if tiny:
            assert 1 <= marked <= 6 and 6 <= in_crop <= 40
        else:
            assert marked > 200 and in_crop > 1000


def test_micro_targets():
    """A micro scene is a tiny scene whose target is 5-8 px: after the one zoom a dot of a
    few pixels in the large model's view (2-3 px across), fewer than a tiny target's."""
    from speceyes_graph.demo.world import MICRO_SIDE, zoomed_crop

    rng = np.random.default_rng(6)
    for _ in range(10):
        s = make_scene(rng, tiny=False, micro=True)
        x1, y1, x2, y2 = s.box
        assert s.tiny and s.micro and MICRO_SIDE[0] <= x2 - x1 <= MICRO_SIDE[1]
        assert tuple(s.image[(y1 + y2) // 2, (x1 + x2) // 2]) == COLOURS[s.colour]
        crop = view(zoomed_crop(s)[0], LARGE_SPEC).astype(int)
        bg = np.median(crop.reshape(-1, 3), axis=0)
        assert 1 <= (np.abs(crop - bg).sum(-1) > 60).sum() <= 16  # a tiny one: up to 40


def test_micro_queries_replace_tiny_ones_and_nothing_else(tmp_path):
    from speceyes_graph.demo import demo_queries

    plain = demo_queries(tmp_path / "a", 60, micro_share=0.0)
    mixed = demo_queries(tmp_path / "b", 60, micro_share=0.25)
    micro = [q for q in mixed if q.meta["micro"]]
    assert len(micro) == 5 and all(q.split == "micro" and q.meta["needs_zoom"] for q in micro)
    for a, b in zip(plain, mixed, strict=True):
        if not b.meta["micro"]:
            assert (a.question, a.expected, a.meta) == (b.question, b.expected, b.meta)
            assert Image.open(a.image).tobytes() == Image.open(b.image).tobytes()
    assert not any(q.meta["micro"] for q in plain)


def test_coordinates_are_single_tokens(processors):
    tok = processors["large"].tokenizer
    for r in range(3):
        for c in range(3):
            text = tool_call_text((r, c))
            pieces = tok.convert_ids_to_tokens(tok.encode(text))
            for v in region_box((r, c)):
                assert str(v) in pieces
            assert tok.decode(tok.encode(text)) == text


def test_region_names_are_single_tokens_after_a_save(processors, tmp_path):
    """Each region name the agent must copy from the question into its box is one token,
    also after the save/load round trip the shipped checkpoints go through."""
    from transformers import AutoTokenizer

    processors["large"].tokenizer.save_pretrained(tmp_path)
    for tok in (processors["large"].tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        for row in REGIONS:
            for name in row:
                text = f"What is the color of the object in the {name} region?"
                pieces = tok.convert_ids_to_tokens(tok.encode(text))
                assert sum(name in p for p in pieces) == 1, pieces
                assert tok.decode(tok.encode(text)) == text


def test_training_prompts_match_what_the_graph_sends(processors, tmp_path):
    """Run the real graph with scripted models that record their prompts; compare renderings."""
    rng = np.random.default_rng(3)
    scene = make_scene(rng, tiny=True)
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

    query = {"question": scene.question, "images": [str(path)], "options": scene.options}
    common = dict(
        speculator=ScriptedChatModel(respond=small),
        agent=ScriptedChatModel(respond=large),
        prompts=DEMO_PROMPTS,
        resize=LARGE_SPEC,
        speculation=SpeculationOptions(resize=SMALL_SPEC),
    )
    # first pass: the draft path (a judge that says no)
    create_speceyes_graph(
        judge=ScriptedChatModel(respond=lambda m: "no"),
        loop=dataclasses.replace(DEMO_GRAPH_SETTINGS["loop"], max_steps=1),
        **common,
    ).compile().invoke(query)
    out = (
        create_speceyes_graph(
            judge=ScriptedChatModel(respond=large), loop=DEMO_GRAPH_SETTINGS["loop"], **common
        )
        .compile()
        .invoke(query)
    )
    assert out["answer"] == scene.colour
    x1, y1, x2, y2 = out["agent_steps"][0]["tool_calls"][0][
        "box"
    ]  # the region, as the tool maps it
    assert _inside(scene.box, scene.region) and x1 <= scene.box[0] and scene.box[2] <= x2
    assert y1 <= scene.box[1] and scene.box[3] <= y2 and abs((x2 - x1) - 1024 / 3) < 12
    for task in ("draft", "judge", "zoom", "after_zoom"):
        wire = to_wire(seen[task], "deepeyes", DEMO_PROMPTS.tool_response_instruction, True)
        hf, images = to_hf_messages(wire)
        proc = processors["small" if task == "draft" else "large"]
        expected_msgs, expected_images, _ = convs[task]
        assert proc.apply_chat_template(
            hf, add_generation_prompt=True, tokenize=False
        ) == proc.apply_chat_template(expected_msgs, add_generation_prompt=True, tokenize=False)
        assert len(images) == len(expected_images)
        for a, b in zip(images, expected_images, strict=True):  # resize and crop paths agree
            assert a.shape == b.shape and np.array_equal(a, b)
    parsed = parse_deepeyes(convs["zoom"][2], {"image_zoom_in_tool"})
    assert parsed.tool_calls[0]["args"]["bbox_2d"] == region_box(scene.region)
    think = convs["zoom"][2].split("</think>")[0]
    assert len(processors["large"].tokenizer.encode(think)) >= 30  # the agent thinks first


def test_small_loop_prompts_match_what_the_graph_sends(processors, tmp_path):
    """Depth 1: the small model's own loop renders exactly its training conversations (its
    128 px view, its box through the small-frame tool, the crop it then sees)."""
    from speceyes_graph.demo.world import SMALL_FRAME

    scene = make_scene(np.random.default_rng(4), tiny=True)
    path = tmp_path / "scene.png"
    Image.fromarray(scene.image).save(path)
    convs = conversations(scene)
    seen = {}

    def small(messages):
        if "<tool_response>" in str(messages[-1].content):
            seen["small_after_zoom"] = messages
            reply = convs["small_after_zoom"][2]
            return AIMessage(
                content=reply,
                response_metadata={"logprobs": fake_logprobs(["<answer>", scene.colour], [9, 9])},
            )
        seen["small_zoom"] = messages
        return convs["small_zoom"][2]

    agent = ScriptedChatModel(respond=lambda m: "<answer>never</answer>")
    out = (
        create_speceyes_graph(
            judge=ScriptedChatModel(respond=lambda m: "yes"),
            speculator=ScriptedChatModel(respond=small),
            agent=agent,
            prompts=DEMO_PROMPTS,
            loop=DEMO_GRAPH_SETTINGS["loop"],
            resize=LARGE_SPEC,
            speculation=SpeculationOptions(resize=SMALL_SPEC, depth=1),
        )
        .compile()
        .invoke({"question": scene.question, "images": [str(path)], "options": scene.options})
    )
    assert out["route"] == "speculative-tools" and out["answer"] == scene.colour
    assert agent.calls == 0
    box = out["tool_draft"]["steps"][0]["tool_calls"][0]["box"]
    r, c = scene.region
    edges = [round(e * 1024 / 128) for e in SMALL_FRAME.edges]
    assert box == [edges[c], edges[r], edges[c + 1], edges[r + 1]]  # the small frame's region
    for task in ("small_zoom", "small_after_zoom"):
        wire = to_wire(seen[task], "deepeyes", DEMO_PROMPTS.tool_response_instruction, True)
        hf, images = to_hf_messages(wire)
        expected_msgs, expected_images, _ = convs[task]
        proc = processors["small"]
        assert proc.apply_chat_template(
            hf, add_generation_prompt=True, tokenize=False
        ) == proc.apply_chat_template(expected_msgs, add_generation_prompt=True, tokenize=False)
        assert len(images) == len(expected_images)
        for a, b in zip(images, expected_images, strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)


def test_encode_and_collate(processors):
    proc = processors["large"]
    scene = make_scene(np.random.default_rng(1), tiny=True)
    convs = conversations(scene)
    samples = [encode(proc, *c) for c in convs.values()]
    batch = collate(samples, proc.tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == len(samples)
    labelled = (batch["labels"] != -100).sum(dim=1)
    assert all(n > 0 for n in labelled.tolist())  # only the reply is trained
    after_zoom = samples[list(convs).index("after_zoom")]
    reply = proc.tokenizer.decode([t for t in after_zoom["labels"].tolist() if t != -100])
    assert reply.startswith("<think>") and scene.colour in reply


def test_shipped_large_checkpoint_evaluates_on_held_out_scenes():
    """The training-time evaluation on the shipped checkpoint: each skill well above chance."""
    from speceyes_graph.demo import demo_models

    model = demo_models(batch_size=16)["large"]
    metrics = evaluate("large", model.hf_model, model.processor, held_out_scenes(16))
    assert metrics["judge_tiny"] >= 0.75 and metrics["judge_large"] >= 0.75
    assert metrics["zoom_tiny"] >= 0.75 and metrics["after_zoom_tiny"] >= 0.6
    micro = evaluate("large", model.hf_model, model.processor, held_out_scenes(0, micro=16))
    assert micro["zoom_micro"] >= 0.75 and micro["after_zoom_micro"] >= 0.5  # chance: 0.25
