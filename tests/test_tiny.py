"""Tiny offline Qwen-VL checkpoints: deterministic, small, loadable the ordinary way, and able to
run the exact generate call the real models get (logits, left-padded batches)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from speceyes_graph.demo.tiny import ADDED_TOKENS, SPECIAL_TOKENS, build_tokenizer, make_tiny_models

CLASSES = {
    "small": ("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor", 16),
    "large": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", 14),
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "image_zoom_in_tool",
            "description": "Zoom in on a region.",
            "parameters": {
                "type": "object",
                "properties": {"bbox_2d": {"type": "array", "items": {"type": "number"}}},
                "required": ["bbox_2d"],
            },
        },
    }
]


@pytest.fixture(scope="session")
def loaded(tiny_models):
    """Load each checkpoint once: loading is most of the cost of the generation tests."""
    return {
        kind: (
            AutoProcessor.from_pretrained(path),
            AutoModelForImageTextToText.from_pretrained(path).eval(),
        )
        for kind, path in tiny_models.items()
    }


def _image(size=(200, 150), colour=(200, 30, 30)):
    return Image.new("RGB", size, colour)


def _prompt(processor, text):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _generate(model, inputs, n=5):
    with torch.no_grad():
        return model.generate(
            **inputs,
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )


def test_build_is_deterministic_per_seed(tiny_models, tmp_path):
    again = make_tiny_models(tmp_path / "again")
    other = make_tiny_models(tmp_path / "other", seed=1)
    for kind, path in tiny_models.items():
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (path / name).read_bytes() == (again[kind] / name).read_bytes(), (kind, name)
        weights = (path / "model.safetensors").read_bytes()
        assert weights != (other[kind] / "model.safetensors").read_bytes()


def test_checkpoints_are_small(tiny_models):
    assert set(tiny_models) == {"small", "large"}
    for path in tiny_models.values():
        total = sum(f.stat().st_size for f in path.iterdir())
        assert total < 2 * 1024 * 1024, (path, total)


@pytest.mark.parametrize("kind", ["small", "large"])
def test_auto_round_trip_and_consistent_config(loaded, kind):
    processor, model = loaded[kind]
    model_cls, processor_cls, patch = CLASSES[kind]
    assert type(model).__name__ == model_cls
    assert type(processor).__name__ == processor_cls
    tok, cfg = processor.tokenizer, model.config
    # The known traps: ids, patch geometry, mrope, projection width.
    for name in ("image_pad", "video_pad", "vision_start", "vision_end"):
        key = name.replace("_pad", "") + "_token_id"
        assert getattr(cfg, key) == tok.convert_tokens_to_ids(f"<|{name}|>"), key
    assert cfg.text_config.vocab_size == len(tok)
    assert cfg.vision_config.patch_size == processor.image_processor.patch_size == patch
    assert processor.video_processor.patch_size == patch
    assert cfg.vision_config.spatial_merge_size == processor.image_processor.merge_size
    head_dim = getattr(cfg.text_config, "head_dim", None) or (
        cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    )
    assert 2 * sum(cfg.text_config.rope_parameters["mrope_section"]) == head_dim
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size
    gen = model.generation_config
    assert gen.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    assert gen.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert gen.do_sample is False


@pytest.mark.parametrize("kind", ["small", "large"])
def test_left_padding_survives_reload(tiny_models, loaded, kind):
    assert loaded[kind][0].tokenizer.padding_side == "left"
    assert AutoTokenizer.from_pretrained(tiny_models[kind]).padding_side == "left"
    config = json.loads((tiny_models[kind] / "tokenizer_config.json").read_text())
    assert config["padding_side"] == "left"


def test_image_budget_is_respected(loaded):
    """``size`` (not min/max_pixels) is what transformers 5 reads: a big image must shrink."""
    for kind, (processor, _) in loaded.items():
        patch = CLASSES[kind][2]
        budget = processor.image_processor.size["longest_edge"]
        grid = processor.image_processor(images=[_image((1000, 800))])["image_grid_thw"][0]
        h, w = int(grid[1]) * patch, int(grid[2]) * patch
        assert h * w <= budget and h * w > budget // 4, (kind, h, w, budget)


def test_tokenizer_round_trips_text():
    tok = build_tokenizer()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    samples = [
        "Hello  world!\n\n  indented\ttab",
        '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4]}}',
        "<think>red?</think>\n<tool_call>\n{}\n</tool_call><answer>B</answer><|im_end|>",
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Naïve café ∑ 😀<|im_end|>",
    ]
    for s in samples:
        assert tok.decode(tok.encode(s)) == s
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        assert len(tok.encode(t)) == 1, t
    assert len(tok.encode("The answer is yes.")) <= 6  # trained merges, not bytes


def test_chat_template_renders_qwen_style(loaded):
    processor = loaded["large"][0]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
        {
            "role": "assistant",
            "content": "<think>zoom</think>",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2]}},
                }
            ],
        },
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "crop"}]},
        {"role": "tool", "content": "second"},
    ]
    text = processor.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "image_zoom_in_tool"' in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' in text
    assert (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Colour?<|im_end|>\n" in text
    )
    assert (
        "<|im_start|>assistant\n<think>zoom</think>\n<tool_call>\n"
        '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2]}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>crop\n"
        "</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    # A given system message replaces the default; no tools, no tool block.
    plain = processor.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        tokenize=False,
    )
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert loaded["small"][0].chat_template == processor.chat_template


@pytest.mark.parametrize("kind", ["small", "large"])
def test_generate_with_logits_batch_one_and_left_padded_two(loaded, kind):
    processor, model = loaded[kind]
    short = _prompt(processor, "Colour?")
    long = _prompt(processor, "What colour is the square in the corner? Answer in one word.")
    image = _image()

    one = processor(text=[short], images=[image], return_tensors="pt")
    out1 = _generate(model, one)
    n_prompt = one["input_ids"].shape[1]
    assert out1.sequences.shape[1] - n_prompt == len(out1.logits) <= 5
    assert out1.logits[0].shape == (1, model.config.text_config.vocab_size)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((one["input_ids"] == image_pad).sum()) == int(one["image_grid_thw"].prod()) // 4

    two = processor(text=[short, long], images=[image, image], return_tensors="pt", padding=True)
    mask = two["attention_mask"]
    assert mask[0, 0] == 0 and mask[:, -1].all()  # left padded: the short row starts with pads
    out2 = _generate(model, two)
    assert out2.sequences.shape[0] == 2 and out2.logits[0].shape[0] == 2
    # Padding must not change what the short prompt sees.
    torch.testing.assert_close(out2.logits[0][0], out1.logits[0][0], atol=1e-4, rtol=1e-4)
