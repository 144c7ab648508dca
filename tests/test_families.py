"""Any image-text-to-text checkpoint works in every role: the graph is not Qwen-shaped.

Eleven families (``speceyes_graph.demo.tiny_families``: their real transformers classes,
processors, tokenizers and chat templates, random tiny weights) through
``ChatTransformersVLM`` as judge, speculator and agent, with one and several images per
request, invoked and batched; mixed image sizes stay one batch and give what each request
gives alone; one BOS; the frame an image is sent in is the family's own processor's.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from PIL import Image

from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.agents.steps import first_user_message
from speceyes_graph.demo.tiny_families import FAMILIES, PALIGEMMA_CHAT_TEMPLATE
from speceyes_graph.messages import to_wire
from speceyes_graph.models import ChatTransformersVLM
from speceyes_graph.models.families import processor_resize
from speceyes_graph.models.served import _checkpoint_resize
from speceyes_graph.prompts import Prompts
from speceyes_tools import ImageStore
from speceyes_tools.images import store_scope
from speceyes_tools.vision import make_image_zoom_in_tool

# one worker builds and loads the eleven families once (pytest-xdist --dist loadgroup)
pytestmark = pytest.mark.xdist_group("tiny_families")

SIZES = ((40, 30), (90, 60), (33, 77), (64, 64), (120, 45), (50, 100), (77, 33), (30, 30))
_MODELS: dict[tuple, ChatTransformersVLM] = {}


def chat(paths, family: str, **kwargs) -> ChatTransformersVLM:
    """The family's checkpoint as a chat model, loaded once per settings."""
    key = (family, tuple(sorted(kwargs.items())))
    if key not in _MODELS:
        extra = {"processor_kwargs": {"chat_template": PALIGEMMA_CHAT_TEMPLATE}}
        _MODELS[key] = ChatTransformersVLM(
            model=str(paths[family]), **(extra if family == "paligemma" else {}), **kwargs
        )
    return _MODELS[key]


def picture(tmp_path, size: tuple[int, int], seed: int) -> str:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    arr[: size[1] // 2, : size[0] // 2] = (220, (40 * seed) % 256, 30)
    path = tmp_path / f"p{seed}_{size[0]}x{size[1]}.png"
    Image.fromarray(arr).save(path)
    return str(path)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def test_every_role_in_the_graph(tiny_families, family, tmp_path):
    """Judge, speculator and agent all of one family; one and two images per query, invoked
    and batched: every query finishes without an error through each role, and a query's
    result is the same batched or alone."""
    small = chat(tiny_families, family, top_logprobs=8, max_new_tokens=4)
    large = chat(tiny_families, family, max_new_tokens=8)
    queries = [
        {"question": "What colour is the block?", "images": [picture(tmp_path, SIZES[0], 1)]},
        {
            "question": "Which picture shows more red?",
            "images": [picture(tmp_path, SIZES[1], 2), picture(tmp_path, SIZES[2], 3)],
            "options": ["the first", "the second"],
        },
    ]
    for mode in ("speceyes", "small", "agent"):
        graph = create_speceyes_graph(
            speculator=small,
            agent=large,
            tools="deepeyes",
            mode=mode,
            gate=GateConfig(tau=0.0, k=8),
            loop=LoopOptions(max_steps=2),
        ).compile()
        batched = graph.batch(queries)
        alone = graph.invoke(queries[1])
        for out in [*batched, alone]:
            assert out["error"] is None, (family, mode, out["error"])
            if mode == "small":  # the speculator's draft is the answer
                assert out["route"] == "draft-only" and out["answer"] is not None
                assert out["draft"]["score"] is not None
            if mode == "speceyes":  # the judge wrote something; its verdict routes the query
                assert out["judge_output"] is not None, family
            if out["route"] in ("agent-only", "judged-agentic", "rejected-agentic"):
                # the agent took its turns (a random model writes no <answer>: step limit)
                assert out["agent_steps"] and all("model_text" in s for s in out["agent_steps"])
        assert _signature(alone) == _signature(batched[1]), (family, mode)


def _signature(out: dict) -> tuple:
    """What each role wrote for a query: judge, draft, agent turns, answer."""
    draft = (out.get("draft") or {}).get("text")
    steps = tuple(s["model_text"] for s in out["agent_steps"] or ())
    return out["route"], out["judge_output"], draft, steps, out["answer"]


def _agent_turn(tmp_path, model: ChatTransformersVLM, size: tuple[int, int], seed: int, store):
    """The agent's second turn after a zoom, as the loop sends it: the question with the
    image, the model's tool call, the zoomed crop in ``<tool_response>``."""
    image = picture(tmp_path, size, seed)
    zoom = make_image_zoom_in_tool(resize=model.resize_spec, store=store)
    first = first_user_message("deepeyes", Prompts(), "Where is the block?", [image], None,
                               model.resize_spec, store)  # fmt: skip
    w, h = model.resize_spec.size(*size)
    call = {"name": zoom.name, "args": {"bbox_2d": [0, 0, w // 2, h // 2]}, "id": "c1"}
    state = {"images": [image]}
    result = zoom.invoke({**call, "args": {**call["args"], "state": state}, "type": "tool_call"})
    assert isinstance(result, ToolMessage) and result.artifact, result
    history = [first, AIMessage(content="", tool_calls=[call]), result]
    return to_wire(history, "deepeyes", Prompts().tool_response_instruction)


def test_a_turn_with_two_images_batches_with_mixed_sizes(tiny_families, family, tmp_path):
    """Eight agent turns, each with its image and a zoomed crop of it, all sizes different:
    one ``generate`` call, and each reply (text and log-probs) what the turn gets alone."""
    store = ImageStore()
    model = chat(tiny_families, family, top_logprobs=4, max_new_tokens=5)
    with store_scope(store):
        turns = [_agent_turn(tmp_path, model, size, i, store) for i, size in enumerate(SIZES)]
        # what is tested is collation, not timing: on a loaded machine the eighth turn's
        # images may be ready later than the worker's usual half second of waiting
        waited, model.scheduler.max_expect_s = model.scheduler.max_expect_s, 60.0
        try:
            batched = model.batch(turns)
        finally:
            model.scheduler.max_expect_s = waited
        alone = [model.invoke(turn) for turn in turns]
    assert [m.response_metadata["batch_size"] for m in batched] == [len(SIZES)] * len(SIZES)
    for b, a in zip(batched, alone, strict=True):
        assert b.content == a.content, family
        top_b = [t["logprob"] for t in b.response_metadata["logprobs"]["content"]]
        top_a = [t["logprob"] for t in a.response_metadata["logprobs"]["content"]]
        np.testing.assert_allclose(top_b, top_a, atol=1e-3)


def test_one_bos_whatever_the_template(tiny_families, family, tmp_path):
    """The prompt starts with exactly one BOS where the tokenizer has one (Gemma 3's and
    Mistral's templates write it; the tokenizer would add a second): what transformers'
    own ``apply_chat_template(tokenize=True)`` gives."""
    import base64

    model = chat(tiny_families, family, max_new_tokens=4)
    tokenizer = model.processor.tokenizer
    path = picture(tmp_path, (48, 40), 5)
    data = base64.b64encode(open(path, "rb").read()).decode()
    block = {"type": "image", "base64": data, "mime_type": "image/png"}
    text = {"type": "text", "text": "Is there a red block?"}
    prepared = model._prepare([HumanMessage(content=[block, text])])
    ids = prepared["inputs"]["input_ids"][0].tolist()
    own = model.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": Image.open(path)}, text]}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"][0].tolist()
    assert ids == own, family
    if tokenizer.bos_token_id is not None:
        assert ids.count(tokenizer.bos_token_id) == 1, family


def test_a_checkpoint_without_a_chat_template_names_the_fix(tiny_families):
    with pytest.raises(ValueError, match=r'processor_kwargs=\{"chat_template"'):
        ChatTransformersVLM(model=str(tiny_families["paligemma"]))


def test_the_frame_is_the_familys_own(tiny_families, family, caplog):
    """The frame images are sent in comes from the family's processor (local and, from the
    same checkpoint folder, served); where the processor keeps a frame (Qwen-VL, Pixtral), an
    image sent in it is not resized again, so the model's pixel boxes map back exactly."""
    model = chat(tiny_families, family, max_new_tokens=4)
    spec = model.resize_spec
    assert _checkpoint_resize(tiny_families[family]) == spec  # what a server of it reads
    if family in ("qwen2.5-vl", "qwen3-vl", "mistral3"):
        for width, height in ((1000, 700), (37, 300), (64, 64)):
            w, h = spec.size(width, height)
            again = spec.size(w, h)
            assert again == (w, h), (family, (width, height))
            arr = np.zeros((h, w, 3), dtype=np.uint8)
            out = model.processor.image_processor.inner(images=[arr], return_tensors="pt")
            if "image_grid_thw" in out:  # Qwen: patches x patch size = the frame
                patch = model.processor.image_processor.patch_size
                _, gh, gw = out["image_grid_thw"][0].tolist()
                assert (gw * patch, gh * patch) == (w, h)
            else:  # Pixtral: the pixels keep the frame's size
                assert tuple(out["pixel_values"].shape[-2:]) == (h, w)
    else:  # tiles or a square: no frame survives; the image goes as it is, bounded
        assert spec.factor == 1 and spec.max_side is None
        assert spec.size(20, 10) == (20, 10)
        assert spec.size(4000, 3000)[0] * spec.size(4000, 3000)[1] <= spec.max_pixels
    with caplog.at_level(logging.WARNING):
        create_speceyes_graph(agent=model, tools="deepeyes", mode="agent")
    unknown = [r for r in caplog.records if "documents no box convention" in r.getMessage()]
    assert bool(unknown) == (model.box_coordinates is None), family


def test_pixtral_frame_is_not_a_qwen_formula():
    """A Pixtral processor config with an integer patch size: the longest-edge rule, not
    Qwen's patch x merge area rule (which sent a 1024x768 image at 28x28)."""
    config = {
        "image_processor_type": "PixtralImageProcessor",
        "patch_size": 14,
        "size": {"longest_edge": 1540},
    }
    spec = processor_resize(config, patch=28)
    assert spec.size(1024, 768) == (1036, 784)  # sides up to multiples of 28, under 1540
    assert spec.size(3080, 1000) == (1540, 504)  # halved to the longest edge, then rounded


def test_the_vision_tower_output_is_reused_exactly(tiny_families, family, tmp_path):
    """The second call with the same image reads the cached encoder output where the
    family's layout splits per image, and the reply is what an uncached model gives."""
    store = ImageStore()
    cached = chat(tiny_families, family, top_logprobs=4, max_new_tokens=5)
    plain = chat(tiny_families, family, top_logprobs=4, max_new_tokens=5, vision_cache_bytes=0,
                 image_cache_bytes=0)  # fmt: skip
    image = picture(tmp_path, (60, 40), 7)
    with store_scope(store):
        turn = _agent_turn(tmp_path, cached, (60, 40), 7, store)
        question = [first_user_message("deepeyes", Prompts(), "Colour?", [image], None,
                                       cached.resize_spec, store)]  # fmt: skip
        # (Llama 3.2 Vision runs its vision model inside forward: no encoder to wrap)
        encoder = getattr(cached.hf_model.base_model, "get_image_features", None)
        hits = getattr(encoder, "hits", 0)
        first, again = cached.invoke(question), cached.invoke(question)
        reference = plain.invoke(question)
        on_turn, reference_turn = cached.invoke(turn), plain.invoke(turn)
    assert first.content == again.content == reference.content, family
    assert on_turn.content == reference_turn.content, family
    got = [t["logprob"] for t in again.response_metadata["logprobs"]["content"]]
    want = [t["logprob"] for t in reference.response_metadata["logprobs"]["content"]]
    np.testing.assert_allclose(got, want, atol=1e-4)
    reused = getattr(encoder, "hits", 0) > hits
    assert reused == (family not in NO_ENCODER_REUSE), (family, getattr(encoder, "hits", 0), hits)


# Where an image's encoder input is not one row (docs/models.md): InternVL's 60x40 image
# is several tiles. Idefics3's and SmolVLM's rows are per prompt, one image here: reused.
# Llama 3.2 Vision has no get_image_features (its forward runs the vision model itself).
NO_ENCODER_REUSE = {"internvl", "mllama"}


def test_mixed_sizes_collate_as_the_processor_pads(tiny_families, family, tmp_path):
    """Requests prepared apart and joined give the same tensors the family's processor gives
    for the batch itself (same padding), wherever the two are laid out alike."""
    model = chat(tiny_families, family, max_new_tokens=4, image_cache_bytes=0)
    images = [np.asarray(Image.open(picture(tmp_path, s, i))) for i, s in enumerate(SIZES[:3])]
    texts = [
        model.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi?"}]}],
            add_generation_prompt=True,
        )
        for _ in images
    ]
    prepared = [
        {"inputs": dict(model.processor(text=[t], images=[[im]], return_tensors="pt"))}
        for t, im in zip(texts, images, strict=True)
    ]
    joined = model.generation._collate(prepared)
    together = model.processor(
        text=texts, images=[[im] for im in images], return_tensors="pt", padding=True
    )
    for name, value in together.items():
        if not isinstance(value, torch.Tensor) or name in ("input_ids", "attention_mask"):
            continue
        if value.shape[0] != joined[name].shape[0]:
            continue  # per-prompt rows against per-image rows: laid out apart, read alike
        assert torch.equal(joined[name], value), (family, name)


def test_a_request_of_two_images_is_what_transformers_makes(tiny_families, family, tmp_path):
    """A request with two images, prepared with the processed-image cache (warm, then
    cold), holds exactly what transformers' own ``apply_chat_template(tokenize=True)``
    makes of the conversation: the same tokens and the same tensors (LLaVA-OneVision treats
    a prompt of two images apart from two prompts of one: the images go as one prompt's)."""
    store = ImageStore()
    model = chat(tiny_families, family, max_new_tokens=4)
    paths = [picture(tmp_path, (70, 50), 11), picture(tmp_path, (40, 90), 12)]
    text = {"type": "text", "text": "Which is redder?"}
    with store_scope(store):
        message = first_user_message("deepeyes", Prompts(), "Which is redder?", paths, None,
                                     model.resize_spec, store)  # fmt: skip
        keys = [b["url"] for b in message.content if b.get("type") == "image"]
        views = [Image.fromarray(np.asarray(store.get(k))) for k in keys]
        message = HumanMessage(content=[*message.content[:-1], text])
        cold = model._prepare([message])["inputs"]
        warm = model._prepare([message])["inputs"]
    own = model.processor.apply_chat_template(
        [{"role": "user", "content": [*({"type": "image", "image": v} for v in views), text]}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    for inputs in (cold, warm):
        assert set(inputs) == set(own), family
        for name, value in own.items():
            assert torch.equal(inputs[name], value), (family, name)


# The published processor configs (their frame-deciding keys; sources in docs/models.md) and
# the frame each gives: the family's own rule, never Qwen's formula on another processor.
PUBLISHED = {
    "Qwen/Qwen2.5-VL-7B-Instruct": (
        {"image_processor_type": "Qwen2_5_VLImageProcessor", "min_pixels": 3136,
         "max_pixels": 12845056, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
        None, (28, 3136, 12845056, None),
    ),
    "Qwen/Qwen3-VL-2B-Instruct": (
        {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
         "temporal_patch_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
        None, (32, 65536, 16777216, None),
    ),
    "mistral-community/pixtral-12b": (
        {"image_processor_type": "PixtralImageProcessor",
         "patch_size": {"height": 16, "width": 16}, "size": {"longest_edge": 1024}},
        None, (16, 1, 1024 * 1024, 1024),
    ),
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": (
        {"image_processor_type": "PixtralImageProcessorFast", "patch_size": 14,
         "size": {"longest_edge": 1540}},
        28, (28, 1, 1540 * 1540, 1540),
    ),
    "google/gemma-3-4b-it": (
        {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 896, "width": 896},
         "do_pan_and_scan": None},
        None, (1, 1, 896 * 896, None),
    ),
    "google/paligemma-3b-mix-448": (
        {"image_processor_type": "SiglipImageProcessor", "size": {"height": 448, "width": 448}},
        None, (1, 1, 448 * 448, None),
    ),
    "OpenGVLab/InternVL3-1B-hf": (  # crop_to_patches is stored off; the processor turns it on
        {"image_processor_type": "GotOcr2ImageProcessorFast", "crop_to_patches": False,
         "max_patches": 12, "size": {"height": 448, "width": 448}},
        None, (1, 1, 12 * 448 * 448, None),
    ),
    "HuggingFaceM4/Idefics3-8B-Llama3": (
        {"image_processor_type": "Idefics3ImageProcessor", "size": {"longest_edge": 1456}},
        None, (1, 1, 1456 * 1456, None),
    ),
    "meta-llama/Llama-3.2-11B-Vision-Instruct": (
        {"image_processor_type": "MllamaImageProcessor", "size": {"height": 560, "width": 560},
         "max_image_tiles": 4},
        None, (1, 1, 4 * 560 * 560, None),
    ),
    "llava-hf/llava-v1.6-mistral-7b-hf": (
        {"image_processor_type": "LlavaNextImageProcessor", "size": {"shortest_edge": 336},
         "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]},
        None, (1, 1, 672 * 672, None),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_configs_give_their_own_frames(name, tmp_path):
    """The frame from each published config (local: the image processor's settings; served:
    the checkpoint folder's files) by that family's rule, and by name alone where no config
    can be read."""
    from speceyes_graph.models.families import FAMILIES, family_of

    config, processor_patch, (factor, min_pixels, max_pixels, max_side) = PUBLISHED[name]
    spec = processor_resize(config, patch=processor_patch)
    assert (spec.factor, spec.min_pixels, spec.max_pixels, spec.max_side) == (
        factor, min_pixels, max_pixels, max_side
    )  # fmt: skip
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    if processor_patch:  # Mistral 3 keeps patch x merge in processor_config.json
        (folder / "processor_config.json").write_text(
            json.dumps({"patch_size": processor_patch // 2, "spatial_merge_size": 2})
        )
    assert _checkpoint_resize(folder) == spec
    assert FAMILIES[family_of(name)] == spec


def test_a_served_model_says_how_it_writes_boxes(tiny_families):
    from speceyes_graph.models.served import ServedModelInfo, served_boxes

    def info(root):
        return ServedModelInfo(name="m", root=str(root), max_model_len=None)

    assert served_boxes("large", info(tiny_families["qwen2.5-vl"])) == "model"
    assert served_boxes("small", info(tiny_families["qwen3-vl"])) == "thousand"
    assert served_boxes("g", info(tiny_families["gemma3"])) is None
    assert served_boxes("ChenShawn/DeepEyes-7B", None) == "model"
    assert served_boxes("google/gemma-3-4b-it", None) is None


def test_a_layout_the_probe_cannot_read_is_cached_whole():
    """An image processor whose output the layout probe cannot compare (lists of tensors) or
    that fails on the probe's images: the call is processed, and kept, whole, never broken."""
    from speceyes_graph.models.image_cache import CachedImageProcessor, image_keys

    calls = []

    def inner(images, return_tensors=None, strict=False):
        flat = [im for group in images for im in group]
        calls.append(len(flat))
        if strict and any(im.shape[0] == 48 for im in flat):  # the probe's first image
            raise ValueError("too small")
        return {"pixel_values": [torch.zeros(2, 3) + im.mean() for im in flat]}

    images = [[np.full((10, 10, 3), 7, np.uint8), np.full((20, 10, 3), 9, np.uint8)]]
    for strict in (False, True):
        cached = CachedImageProcessor(lambda im, s=strict, **kw: inner(im, strict=s, **kw))
        with image_keys(["blob://a", "blob://b"]):
            first = cached(images, return_tensors="pt")
            again = cached(images, return_tensors="pt")
        want = inner(images)["pixel_values"]
        for out in (first, again):
            assert [float(t.mean()) for t in out["pixel_values"]] == [float(t.mean()) for t in want]
        assert (cached.hits, cached.misses) == (1, 1)  # the whole call, kept once
