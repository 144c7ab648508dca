"""The tiny checkpoints of eleven image-text-to-text families load and run like the real ones.

Only transformers' public API is used on the built folders (``AutoProcessor``,
``AutoModelForImageTextToText``, ``AutoTokenizer``), as a user's code would load a real
checkpoint: what these tests pin is that the fixtures behave like the families they stand for
(image placeholders, tiling, BOS handling, chat templates, left-padded batches), so that tests
of the library over them mean something.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from speceyes_graph.demo.tiny_families import (
    CHAT_TEMPLATES,
    FAMILIES,
    PALIGEMMA_CHAT_TEMPLATE,
    make_tiny_family,
)

# one worker builds and loads them all once (pytest-xdist --dist loadgroup)
pytestmark = pytest.mark.xdist_group("tiny_families")

# The class each real checkpoint loads as, and whether its tokenizer adds BOS on encode.
EXPECTED = {
    "qwen2.5-vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration", False),
    "qwen3-vl": ("Qwen3VLProcessor", "Qwen3VLForConditionalGeneration", False),
    "idefics3": ("Idefics3Processor", "Idefics3ForConditionalGeneration", True),
    "smolvlm": ("SmolVLMProcessor", "SmolVLMForConditionalGeneration", False),
    "llava-onevision": ("LlavaOnevisionProcessor", "LlavaOnevisionForConditionalGeneration", False),
    "gemma3": ("Gemma3Processor", "Gemma3ForConditionalGeneration", True),
    "internvl": ("InternVLProcessor", "InternVLForConditionalGeneration", False),
    "mistral3": ("PixtralProcessor", "Mistral3ForConditionalGeneration", True),
    # PaliGemmaProcessor turns the tokenizer's BOS off and inserts it after the image tokens
    "paligemma": ("PaliGemmaProcessor", "PaliGemmaForConditionalGeneration", False),
    "llava-next": ("LlavaNextProcessor", "LlavaNextForConditionalGeneration", True),
    "mllama": ("MllamaProcessor", "MllamaForConditionalGeneration", True),
}
# Families whose chat template writes the BOS token itself (the double-BOS trap).
TEMPLATE_WRITES_BOS = {"idefics3", "gemma3", "mistral3", "mllama"}

SIZES = ((40, 30), (90, 60), (33, 77))  # width x height, three aspect ratios
TEXTS = (
    "What is the color of the small square?",
    "Which object is on the left? Answer: A",
    "How many red boxes are there in the image? Think first.",
)


def image(size: tuple[int, int], seed: int) -> Image.Image:
    """A noisy picture with a coloured block, so different images give different features."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    arr[: size[1] // 2, : size[0] // 2] = (220, 30 * seed % 256, 30)
    return Image.fromarray(arr)


def conversation(n_images: int, text: str, images: list | None = None) -> list[dict]:
    parts: list[dict] = [
        {"type": "image", **({"image": images[i]} if images else {})} for i in range(n_images)
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="session")
def built(tiny_families) -> dict[str, Path]:
    return tiny_families


_LOADED: dict[str, tuple] = {}


@pytest.fixture
def loaded(built, request):
    """(processor, model) for the test's family, loaded by folder once per session."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    family = request.param
    if family not in _LOADED:
        path = built[family]
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        _LOADED[family] = (AutoProcessor.from_pretrained(path), model)
    return (family, *_LOADED[family])


def template_kwargs(family: str) -> dict:
    return {"chat_template": PALIGEMMA_CHAT_TEMPLATE} if family == "paligemma" else {}


def prompt(processor, family: str, n_images: int, text: str) -> str:
    return processor.apply_chat_template(
        conversation(n_images, text), add_generation_prompt=True, **template_kwargs(family)
    )


def generate(processor, model, texts: list[str], images: list[list]) -> list[list[int]]:
    """Greedy new tokens for each prompt (the prompts left-padded into one batch), each cut
    after its first end-of-turn token: a row that stops early is padded in a batch."""
    inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    rows = []
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


families = pytest.mark.parametrize("loaded", FAMILIES, indirect=True)


@families
def test_loads_by_folder_as_the_real_classes(loaded):
    family, processor, model = loaded
    processor_cls, model_cls, _ = EXPECTED[family]
    assert type(processor).__name__ == processor_cls
    assert type(model).__name__ == model_cls
    assert processor.tokenizer.padding_side == "left"
    assert processor.tokenizer.pad_token_id is not None
    generation = model.generation_config
    assert not generation.do_sample and generation.eos_token_id is not None
    assert processor.chat_template == CHAT_TEMPLATES.get(family)


@families
def test_tokenizer_round_trips(loaded, tmp_path):
    """Any string encodes and decodes intact; the agent tags are single tokens; the loaded
    tokenizer encodes as the saved tokenizer.json does (no class rebuilt it differently),
    and as it does after another save and load; BOS is added exactly where the family adds it."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    family, processor, _ = loaded
    tok = processor.tokenizer
    samples = [
        "Hello world! How are you?",
        # (not at the very start: Llama/Mistral's SentencePiece-style tokenizer, like the real
        # one, drops one space of leading whitespace when it strips its dummy prefix)
        'Call  <tool_call>\n{"name": "zoom", "arguments": {"bbox_2d": [1, 2, 3, 4]}}\n</tool_call>',
        "Ünïcödé — 日本語 🙂 tab\tnew\nline",
        "<think>red</think><answer>A</answer>",
    ]
    for text in samples:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</answer>", "<tool_response>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag

    folder = Path(tok.name_or_path)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    alone = AutoTokenizer.from_pretrained(folder)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in samples:
        assert alone.encode(text) == raw.encode(text).ids
        assert tok.encode(text) == again.encode(text)

    def adds_bos(t) -> bool:
        return t.bos_token_id is not None and t.encode("hi")[0] == t.bos_token_id

    assert adds_bos(tok) == EXPECTED[family][2]
    # PaliGemma's tokenizer adds <bos> when used alone; its processor turns that off
    assert adds_bos(alone) == (EXPECTED[family][2] or family == "paligemma")


@families
@pytest.mark.parametrize("n_images", [1, 2])
def test_chat_template_renders_images(loaded, n_images):
    family, processor, _ = loaded
    text = prompt(processor, family, n_images, "What is this?")
    assert text.count(processor.image_token) == n_images
    assert "What is this?" in text


@families
def test_template_tokenized_has_one_bos(loaded):
    """Through the processor's own apply_chat_template(tokenize=True), a template that writes
    BOS itself does not get a second one from the tokenizer."""
    family, processor, _ = loaded
    images = [image(SIZES[0], 0)]
    out = processor.apply_chat_template(
        conversation(1, "What is this?", images),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        **template_kwargs(family),
    )
    bos = processor.tokenizer.bos_token_id
    if bos is None:
        pytest.skip(f"{family}'s tokenizer has no BOS token")
    assert out["input_ids"][0].tolist().count(bos) == 1


@families
def test_plain_call_on_rendered_template(loaded):
    """The trap these fixtures reproduce: rendering the template, then calling the processor
    on the text, doubles BOS exactly for the families whose template writes it."""
    family, processor, _ = loaded
    text = prompt(processor, family, 1, "What is this?")
    ids = processor(text=[text], images=[[image(SIZES[0], 0)]], return_tensors="pt")["input_ids"]
    bos = processor.tokenizer.bos_token_id
    count = ids[0].tolist().count(bos) if bos is not None else 0
    expected = 2 if family in TEMPLATE_WRITES_BOS else (0 if bos is None else 1)
    if family == "smolvlm":  # bos is <|im_start|>, written once by the template, never added
        expected = 1
    assert count == expected


@families
def test_generates_with_one_and_two_images(loaded):
    family, processor, model = loaded
    one = generate(
        processor, model, [prompt(processor, family, 1, TEXTS[0])], [[image(SIZES[1], 1)]]
    )
    two = generate(
        processor,
        model,
        [prompt(processor, family, 2, TEXTS[1])],
        [[image(SIZES[0], 2), image(SIZES[2], 3)]],
    )
    assert len(one[0]) >= 1 and len(two[0]) >= 1
    # random weights, but not so flat that greedy decoding repeats one token
    assert len(set(one[0])) > 1 or len(set(two[0])) > 1


@families
def test_the_image_reaches_the_text(loaded):
    """Two images under the same prompt give different next-token logits (no projection
    left at zero between the vision tower and the decoder)."""
    family, processor, model = loaded
    text = prompt(processor, family, 1, TEXTS[0])
    logits = []
    for seed in (1, 2):
        inputs = processor(text=[text], images=[[image(SIZES[0], seed)]], return_tensors="pt")
        with torch.no_grad():
            logits.append(model(**inputs).logits[0, -1])
    assert (logits[0] - logits[1]).abs().max() > 1e-2


@families
def test_left_padded_batch_equals_each_prompt_alone(loaded):
    """Three prompts with images of three sizes (different tile counts and token counts),
    left-padded into one batch, decode as each does alone (fp32)."""
    family, processor, model = loaded
    texts = [prompt(processor, family, 1, t) for t in TEXTS]
    images = [[image(size, seed)] for seed, size in enumerate(SIZES)]
    batched = generate(processor, model, texts, images)
    alone = [generate(processor, model, [t], [i])[0] for t, i in zip(texts, images)]
    assert batched == alone


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_builds_the_same_bytes(built, family, tmp_path):
    again = make_tiny_family(family, tmp_path / family, seed=0)
    names = sorted(p.name for p in built[family].iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(built[family], again, names, shallow=False)
    assert not mismatch and not errors
