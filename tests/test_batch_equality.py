"""A batch gives each query what it gets alone, for every family.

Requests are prepared apart (chat template, processor, image caches) and joined by the batch
worker (``BatchedGeneration._collate``): every tensor aligned with the token sequence -- in
whatever dimension: 2-D masks and ids, Llama 3.2 Vision's 4-D ``cross_attention_mask`` -- is
padded on the tokenizer's padding side, everything else (pixels, tiles, images) at the end,
as the family's processor pads a batch. Mixed prompt lengths, image sizes and image counts in
one ``generate`` call; each reply's text and log-probs must be those of the query alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage

from speceyes_graph.demo.tiny_families import FAMILIES, PALIGEMMA_CHAT_TEMPLATE
from speceyes_graph.models import ChatTransformersVLM
from speceyes_graph.models.collate import exact_groups
from speceyes_graph.models.conversion import fold_system, refuses_system_turn
from speceyes_tools import ImageStore
from speceyes_tools.images import store_scope

# one worker builds and loads the families once (pytest-xdist --dist loadgroup)
pytestmark = pytest.mark.xdist_group("tiny_families")

# (question, image sizes (width x height)): prompts of different lengths, images of different
# sizes (tile counts, aspect ratios) and counts, in one batch
QUERIES = (
    ("Colour?", ((40, 30),)),
    ("Which of the objects in this picture is the largest, and what colour is it?", ((90, 60),)),
    ("Compare the two pictures: which shows more red?", ((33, 77), (64, 64))),
    ("Is the block in the upper left corner of the picture?", ((120, 45),)),
)
SYSTEM = "You answer questions about images. Be brief."
_MODELS: dict[str, ChatTransformersVLM] = {}


def chat(paths, family: str) -> ChatTransformersVLM:
    if family not in _MODELS:
        extra = {"processor_kwargs": {"chat_template": PALIGEMMA_CHAT_TEMPLATE}}
        _MODELS[family] = ChatTransformersVLM(
            model=str(paths[family]),
            top_logprobs=4,
            max_new_tokens=5,
            **(extra if family == "paligemma" else {}),
        )
    return _MODELS[family]


def _messages(store: ImageStore, question: str, sizes, seed: int) -> list:
    blocks = []
    for i, (w, h) in enumerate(sizes):
        rng = np.random.default_rng(seed * 10 + i)
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        arr[: h // 2, : w // 2] = (220, (40 * seed) % 256, 30)
        blocks.append({"type": "image", "url": store.put_array(arr)})
    return [
        SystemMessage(content=SYSTEM),
        HumanMessage(content=[*blocks, {"type": "text", "text": question}]),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_equals_its_queries_alone(tiny_families, family):
    model = chat(tiny_families, family)
    store = ImageStore()
    with store_scope(store):
        queries = [_messages(store, q, sizes, i) for i, (q, sizes) in enumerate(QUERIES)]
        prepared = [model._prepare(q) for q in queries]
        lengths = {p["n_prompt"] for p in prepared}
        assert len(lengths) == len(queries), (family, lengths)  # every prompt length differs
        groups = exact_groups([p["inputs"] for p in prepared])
        waited, model.scheduler.max_expect_s = model.scheduler.max_expect_s, 60.0
        try:
            batched = model.batch(queries)
        finally:
            model.scheduler.max_expect_s = waited
        alone = [model.invoke(q) for q in queries]
    # one generate call for all, but for Llama 3.2 Vision's prompts of other image counts
    # (its text rows that see no image read padded image slots: collate.exact_groups)
    assert len(groups) == (2 if family == "mllama" else 1), (family, groups)
    sizes = {i: len(g) for g in groups for i in g}
    assert [m.response_metadata["batch_size"] for m in batched] == [
        sizes[i] for i in range(len(queries))
    ]
    for i, (b, a) in enumerate(zip(batched, alone, strict=True)):
        assert b.content == a.content, (family, i)
        got = [t["logprob"] for t in b.response_metadata["logprobs"]["content"]]
        want = [t["logprob"] for t in a.response_metadata["logprobs"]["content"]]
        np.testing.assert_allclose(got, want, atol=1e-3, err_msg=f"{family} query {i}")


@pytest.mark.parametrize("family", FAMILIES)
def test_collate_pads_the_sequence_on_the_padding_side(tiny_families, family):
    """The joined tensors: each sequence-aligned one (any dimension that is every request's
    token count) holds a request's values at the end of its row, the padding before them
    (left padding) with the pad id in ``input_ids``, -100 in ``labels`` (as PaliGemma's
    processor pads them) and zeros elsewhere."""
    model = chat(tiny_families, family)
    store = ImageStore()
    with store_scope(store):
        prepared = [model._prepare(_messages(store, q, s, i)) for i, (q, s) in enumerate(QUERIES)]
    joined = model.generation._collate(prepared)
    lengths = [p["n_prompt"] for p in prepared]
    longest = max(lengths)
    pad_id = model.processor.tokenizer.pad_token_id
    aligned = 0
    for name, value in prepared[0]["inputs"].items():
        if not isinstance(value, torch.Tensor) or value.ndim < 2 or value.shape[0] != 1:
            continue
        dims = [d for d in range(1, value.ndim) if value.shape[d] == lengths[0]]
        dims = [d for d in dims if all(p["inputs"][name].shape[d] == n for p, n in
                                       zip(prepared, lengths, strict=True))]  # fmt: skip
        if not dims:
            continue
        aligned += 1
        d = dims[0]
        assert joined[name].shape[d] == longest, (family, name)
        for row, (p, n) in enumerate(zip(prepared, lengths, strict=True)):
            own = p["inputs"][name][0]
            got = joined[name][row].narrow(d - 1, longest - n, n)
            assert torch.equal(got[tuple(slice(0, k) for k in own.shape)], own), (family, name)
            pad = joined[name][row].narrow(d - 1, 0, longest - n)
            fill = {"input_ids": pad_id, "labels": -100}.get(name, 0)  # PaliGemma: labels
            assert bool((pad == fill).all()), (family, name)
    assert aligned >= 2, family  # input_ids and attention_mask at least


@pytest.mark.parametrize("family", FAMILIES)
def test_a_template_that_refuses_a_system_turn_gets_it_folded(tiny_families, family):
    """Llama 3.2 Vision's template raises on a system turn beside an image: its system
    prompt goes into the first user turn, detected from the template; the other families'
    templates keep their system turn. Forced either way by ``system_turn``."""
    model = chat(tiny_families, family)
    assert model.folds_system_turn == (family == "mllama"), family
    store = ImageStore()
    with store_scope(store):
        messages = _messages(store, "What colour?", ((40, 30),), 1)
        prompt = model.processor.tokenizer.decode(
            model._prepare(messages)["inputs"]["input_ids"][0]
        )
    assert SYSTEM in prompt and "What colour?" in prompt, family
    if family == "mllama":  # one user turn: the system text, a blank line, the image, the question
        assert "<|start_header_id|>system" not in prompt
        assert f"user<|end_header_id|>\n\n{SYSTEM}\n\n<|image|>What colour?<|eot_id|>" in prompt


def test_fold_system_rules():
    text = {"type": "text", "text": "Q?"}
    image = {"type": "image"}
    assert fold_system(
        [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
         {"role": "user", "content": [image, text]}]
    ) == [{"role": "user", "content": [{"type": "text", "text": "Be brief.\n\n"}, image, text]}]  # fmt: skip
    # an empty system turn is dropped (Llama 3.2 Vision's template raises on it too)
    assert fold_system(
        [{"role": "system", "content": []}, {"role": "user", "content": [text]}]
    ) == [{"role": "user", "content": [text]}]
    # string content; a system turn with no user turn after it becomes one
    assert fold_system([{"role": "system", "content": "S"}]) == [
        {"role": "user", "content": [{"type": "text", "text": "S"}]}
    ]
    later = [{"role": "user", "content": [text]}, {"role": "assistant", "content": "A"}]
    assert fold_system([*later, {"role": "system", "content": "S"}, {"role": "user", "content": "U"}]) == [
        *later, {"role": "user", "content": [{"type": "text", "text": "S\n\n"}, {"type": "text", "text": "U"}]}
    ]  # fmt: skip


def test_refuses_system_turn_probe():
    def raising(messages):
        if messages[0]["role"] == "system":
            raise ValueError("Prompting with images is incompatible with system messages.")
        return "".join(p.get("text", "<image>") for m in messages for p in m["content"])

    def dropping(messages):
        return "".join(p.get("text", "") for m in messages if m["role"] != "system"
                       for p in m["content"])  # fmt: skip

    def keeping(messages):
        return "".join(p.get("text", "") for m in messages for p in m["content"])

    def broken(messages):
        raise ValueError("no template")

    assert refuses_system_turn(raising) and refuses_system_turn(dropping)
    assert not refuses_system_turn(keeping) and not refuses_system_turn(broken)


def test_system_turn_option_forces_either_way(tiny_families):
    keep = ChatTransformersVLM(model=str(tiny_families["mllama"]), system_turn="keep",
                               max_new_tokens=2)  # fmt: skip
    fold = ChatTransformersVLM(model=str(tiny_families["qwen3-vl"]), system_turn="fold",
                               max_new_tokens=2)  # fmt: skip
    assert not keep.folds_system_turn and fold.folds_system_turn
    store = ImageStore()
    with store_scope(store):
        messages = _messages(store, "Colour?", ((40, 30),), 2)
        with pytest.raises(Exception, match="incompatible with system messages"):
            keep._prepare(messages)
        ids = fold._prepare(messages)["inputs"]["input_ids"][0]
    prompt = fold.processor.tokenizer.decode(ids)
    assert f"<|im_start|>user\n{SYSTEM}\n\n" in prompt, prompt


def test_collate_rules():
    from speceyes_graph.models.collate import pad_cat, pad_sequences, sequence_dim

    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[4]])]
    assert sequence_dim(ids, [3, 1]) == 1
    left = pad_sequences(ids, 1, 9, left=True)
    assert left.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert pad_sequences(ids, 1, 9, left=False).tolist() == [[1, 2, 3], [4, 9, 9]]
    # a 4-D mask [1, tokens, images, tiles]: the tokens padded on the left, images at the end
    a, b = torch.ones(1, 3, 1, 2, dtype=torch.long), torch.full((1, 2, 2, 2), 2)
    assert sequence_dim([a, b], [3, 2]) == 1
    mask = pad_sequences([a, b], 1, 0)
    assert mask.shape == (2, 3, 2, 2)
    assert mask[0, :, 0].eq(1).all() and mask[0, :, 1].eq(0).all()  # no second image
    assert mask[1, 0].eq(0).all() and mask[1, 1:].eq(2).all()  # one token of left padding
    # not sequence-aligned: flattened patches, or a request without the tensor
    patches = [torch.zeros(8, 5), torch.zeros(4, 5)]
    assert sequence_dim(patches, [8, 4]) is None
    assert sequence_dim([torch.zeros(1, 3)], [4]) is None
    # shapes that agree beyond the first dimension: one torch.cat (no zero-filled buffer)
    assert torch.equal(pad_cat(patches), torch.cat(patches))
    grown = pad_cat([torch.ones(1, 2, 3), torch.ones(2, 1, 4)])
    assert grown.shape == (3, 2, 4) and grown.sum() == 6 + 8


def test_exact_groups():
    def request(n: int, images: int) -> dict:
        return {
            "input_ids": torch.zeros(1, n, dtype=torch.long),
            "attention_mask": torch.ones(1, n, dtype=torch.long),
            "cross_attention_mask": torch.ones(1, n, images, 4, dtype=torch.long),
            "pixel_values": torch.zeros(1, images, 4, 3, 8, 8),
        }

    text_only = {"input_ids": torch.zeros(1, 5), "attention_mask": torch.ones(1, 5)}
    assert exact_groups([request(5, 1), request(9, 1), request(7, 1)]) == [[0, 1, 2]]
    assert exact_groups([request(5, 1), request(9, 2), request(7, 1), text_only]) == [
        [0, 2],
        [1],
        [3],
    ]
    flat = {"input_ids": torch.zeros(1, 5), "pixel_values": torch.zeros(16, 12)}
    assert exact_groups([flat, {**flat, "input_ids": torch.zeros(1, 7)}]) == [[0, 1]]
