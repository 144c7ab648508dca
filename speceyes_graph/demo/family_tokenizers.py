"""The tokenizers of the eleven tiny families (:mod:`.tiny_families`): small BPE vocabularies
trained here, in each real family's tokenizer class and pipeline (byte-level or byte
fallback, its special tokens, whether it adds a BOS), so that they round-trip through
``save_pretrained`` and behave as the real ones do where it matters to a prompt."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from speceyes_graph.demo.tiny import _CORPUS_LINES, ADDED_TOKENS, build_tokenizer

__all__ = [
    "gemma3_tokenizer",
    "llama2_tokenizer",
    "llama3_tokenizer",
    "llama32_vision_tokenizer",
    "paligemma_tokenizer",
    "qwen2_tokenizer",
    "smollm2_tokenizer",
    "tekken_tokenizer",
]

# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------

# Words the templates and prompts of the families use, so they tokenize into few pieces.
_FAMILY_CORPUS = (
    "User: Assistant: System: Tool: user assistant system model tool",
    "<start_of_turn>user\n<end_of_turn>\n<start_of_turn>model\n",
    "[INST] What is shown in this image? [/INST] The image shows a radar chart.",
    "<<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n",
    "Mistral Small 3 Large Language Model created by Mistral AI, a French startup in Paris.",
    "Your knowledge base was last updated on 2023-10-01. The current date is 2025-03-17.",
    "answer en What is on the image? caption en detect cat ; segment dog",
    "Frame from 00:01: You are provided the following series of frames from a video.",
)

# The pre-tokenizer regexes of the real byte-level vocabularies.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_BYTE_FALLBACK = tuple(f"<0x{b:02X}>" for b in range(256))


def _corpus() -> list[str]:
    """Training text: tiny.py's lines plus the families' own words, repeated so every piece
    clears the trainer's ``min_frequency``."""
    return [line for _ in range(4) for line in (*_CORPUS_LINES, *_FAMILY_CORPUS)]


def _train_bpe(pre_tokenizer: Any, normalizer: Any, alphabet: Sequence[str], size: int) -> Any:
    """Train a BPE model on the corpus under the given pipeline; returns (pieces, merges)."""
    from tokenizers import Tokenizer, models, trainers

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizer
    bpe.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        min_frequency=2,
        initial_alphabet=list(alphabet),
        show_progress=False,
        special_tokens=[],
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return pieces, merges


def _byte_level_bpe(
    regex: str,
    head: Sequence[str],
    tail: Sequence[str],
    *,
    split_digits: bool = False,
    size: int = 768,
) -> Any:
    """A byte-level BPE (GPT-2 / Llama 3 / Tekken style) as a ``tokenizers.Tokenizer``.

    ``head`` tokens get the lowest ids (SmolLM2's and Tekken's control tokens come first),
    ``tail`` tokens follow the learned pieces (Llama 3's come last). Every byte is in the
    alphabet, so any string encodes and ``decode(encode(s)) == s``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    pre = pre_tokenizers.Sequence(
        [
            *steps,
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    pieces, merges = _train_bpe(pre, None, pre_tokenizers.ByteLevel.alphabet(), size)
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*head, *pieces, *tail]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(head: Sequence[str], *, size: int = 768) -> tuple[dict[str, int], list]:
    """Vocabulary and merges of a SentencePiece-style BPE (Llama 2 / Mistral / Gemma).

    Pieces carry ``▁`` for spaces and the 256 ``<0xNN>`` byte tokens follow ``head`` (as in
    the real vocabularies), so with ``byte_fallback`` any string encodes and decodes intact.
    Trained word by word; the family's tokenizer class supplies its own pipeline on top.
    """
    from tokenizers import normalizers, pre_tokenizers

    pieces, merges = _train_bpe(
        pre_tokenizers.Split("▁", behavior="merged_with_next"),
        normalizers.Replace(" ", "▁"),
        (),
        size,
    )
    ordered = dict.fromkeys([*head, *_BYTE_FALLBACK, *pieces])
    return {t: i for i, t in enumerate(ordered)}, merges


def _finish(tok: Any, specials: Sequence[str], chat_template: str | None) -> Any:
    """Mark the family's control tokens special (never split, skipped by
    ``skip_special_tokens``), add the agent-protocol tags as plain added tokens (single tokens
    that decode intact), and set the chat template and left padding."""
    from transformers import AddedToken

    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(t, special=True, normalized=False) for t in specials
            ]
        },
        replace_extra_special_tokens=False,
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.padding_side = "left"
    tok.chat_template = chat_template
    return tok


def _backend(tok: Any, **kwargs: Any) -> Any:
    """Wrap a ``tokenizers.Tokenizer`` as transformers 5's ``TokenizersBackend`` (the class
    ``PreTrainedTokenizerFast`` now names), which saves and reloads its tokenizer.json as is."""
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_object=tok, padding_side="left", **kwargs)


def llama3_tokenizer(template: str) -> Any:
    """Idefics3-8B-Llama3's tokenizer: Llama 3's byte-level BPE with its reserved tokens last,
    loaded as ``PreTrainedTokenizerFast`` and adding ``<|begin_of_text|>`` on encode."""
    named = ("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|eot_id|>")
    image = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    grid = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    specials = (*named, *image, *grid)
    tok = _byte_level_bpe(_LLAMA3_REGEX, (), specials)
    tok = _backend(
        tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|finetune_right_pad_id|>",
        add_bos_token=True,
        model_max_length=131072,
    )
    return _finish(tok, specials, template)


def llama32_vision_tokenizer(template: str) -> Any:
    """Llama 3.2 Vision's tokenizer: Llama 3.1's byte-level BPE with its named special tokens
    after the learned pieces (``<|begin_of_text|>`` ... ``<|python_tag|>``, as ids 128000-128010
    are ordered) and ``<|image|>`` after them (128256 in the real one), loaded as
    ``PreTrainedTokenizerFast``, adding ``<|begin_of_text|>`` on encode; ``<|eot_id|>`` ends a
    turn, ``<|finetune_right_pad_id|>`` pads."""
    named = (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    )
    specials = (*named, "<|image|>")
    tok = _byte_level_bpe(_LLAMA3_REGEX, (), specials)
    tok = _backend(
        tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        add_bos_token=True,
        model_max_length=131072,
    )
    return _finish(tok, specials, template)


def smollm2_tokenizer(template: str) -> Any:
    """SmolVLM2's tokenizer: SmolLM2's byte-level BPE with its control tokens first; bos is
    ``<|im_start|>`` but nothing is added on encode (GPT2Tokenizer on the Hub, loaded as
    ``TokenizersBackend`` by transformers 5)."""
    head = (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<repo_name>",
        "<reponame>",
        "<file_sep>",
        "<filename>",
        "<gh_stars>",
        "<issue_start>",
        "<issue_comment>",
        "<issue_closed>",
        "<jupyter_start>",
        "<jupyter_text>",
        "<jupyter_code>",
        "<jupyter_output>",
        "<jupyter_script>",
        "<empty_output>",
    )
    image = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    grid = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    tail = (*image, "<video>", *grid)
    tok = _byte_level_bpe(_GPT2_REGEX, head, tail, split_digits=True)  # SmolLM2 splits digits
    tok = _backend(
        tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=8192,
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "end_of_utterance_token": "<end_of_utterance>",
            "global_image_token": "<global-img>",
            "video_token": "<video>",
        },
    )
    return _finish(tok, (*head[:3], *tail), template)


def tekken_tokenizer(template: str) -> Any:
    """Mistral Small 3.1's Tekken tokenizer: byte-level BPE whose control tokens take the
    first ids (``[IMG]`` is 10 as in the real one), adding ``<s>`` on encode."""
    head = (
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[TOOL_CALLS]",
        "[IMG]",
        "<pad>",
        "[IMG_BREAK]",
        "[IMG_END]",
        "[PREFIX]",
        "[MIDDLE]",
        "[SUFFIX]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CONTENT]",
    )
    tok = _byte_level_bpe(_TEKKEN_REGEX, head, ())
    tok = _backend(
        tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        model_max_length=131072,
    )
    return _finish(tok, head, template)


# Gemma's first ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, [@BOS@] 5.
_GEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]")


def _gemma_tokenizer(
    head: Sequence[str], specials: Sequence[str], template: str | None, **kw: Any
) -> Any:
    """A ``GemmaTokenizer`` (SentencePiece-style BPE with byte fallback) adding ``<bos>``.

    transformers 5 rebuilds GemmaTokenizer from vocab + merges on load with this same
    pipeline, keeping the saved post-processor, so what is saved is what loads.
    """
    from transformers import GemmaTokenizer

    vocab, merges = _sentencepiece_bpe(head)
    tok = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        add_bos_token=True,
        add_eos_token=False,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        **kw,
    )
    return _finish(tok, specials, template)


def gemma3_tokenizer(template: str) -> Any:
    """Gemma 3's tokenizer with its turn and image tokens (boi/eoi/image named as the real
    tokenizer_config's ``extra_special_tokens`` name them, which Gemma3Processor reads)."""
    turns = ("<start_of_turn>", "<end_of_turn>")
    image = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
    return _gemma_tokenizer(
        (*_GEMMA_HEAD, *turns, *image),
        (*turns, *image),
        template,
        model_max_length=131072,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )


def paligemma_tokenizer() -> Any:
    """PaliGemma's Gemma tokenizer with ``<image>``; PaliGemmaProcessor adds the 1024
    ``<locNNNN>`` and 128 ``<segNNN>`` tokens itself and turns the BOS off, inserting it
    after the image tokens instead."""
    return _gemma_tokenizer((*_GEMMA_HEAD, "<image>"), ("<image>",), None, model_max_length=1000000)


def llama2_tokenizer(template: str) -> Any:
    """llava-v1.6-mistral's tokenizer: Mistral 7B's SentencePiece BPE (``<unk>``, ``<s>``,
    ``</s>``, then the byte tokens, as ids 0-258), with ``<image>`` and ``<pad>`` appended.

    Built as ``LlamaTokenizer`` (its Hub class); transformers 5 loads llava_next's tokenizer as
    ``TokenizersBackend`` from the saved tokenizer.json, so the pipeline round-trips.
    """
    from transformers import LlamaTokenizer

    vocab, merges = _sentencepiece_bpe(("<unk>", "<s>", "</s>"))
    for extra in ("<image>", "<pad>"):
        vocab[extra] = len(vocab)
    tok = LlamaTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        add_eos_token=False,
        legacy=False,
        padding_side="left",
        model_max_length=32768,
    )
    return _finish(tok, ("<image>", "<pad>"), template)


def qwen2_tokenizer(template: str, specials: Sequence[str], extra: dict[str, str]) -> Any:
    """A Qwen2 tokenizer (tiny.py's, no BOS) with the family's image tokens added."""
    import tempfile

    from transformers import Qwen2Tokenizer

    tok = build_tokenizer()
    # the image tokens first (their ids in this order), then named (``tokenizer.image_token``
    # ...) the way the real conversions name them: by reloading with ``extra_special_tokens``
    tok.add_special_tokens(
        {"additional_special_tokens": list(specials)}, replace_extra_special_tokens=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        tok = Qwen2Tokenizer.from_pretrained(tmp, extra_special_tokens=extra)
    return _finish(tok, specials, template)
