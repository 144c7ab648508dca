"""Tiny random Qwen-VL checkpoints built offline, for tests and demos without a model hub.

``make_tiny_models(out)`` writes ``out/small`` (Qwen3-VL) and ``out/large`` (Qwen2.5-VL): real
architectures, real processor classes and a Qwen-style chat template, but a few hundred
thousand random weights, so the whole transformers path (``AutoProcessor``,
``AutoModelForImageTextToText``, ``generate`` with logits, left-padded batches) runs on a CPU in
seconds. The answers are noise; only the plumbing is real.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ADDED_TOKENS",
    "QWEN_CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "cached_tiny_models",
    "make_tiny_models",
]

# Special tokens in the order the real Qwen vocabularies list them (ids follow the BPE vocab).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Tags the agent protocol parses; single tokens (as in Qwen) so they decode intact and cheaply.
ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
)

# Qwen2.5-VL's content rendering and default system prompt, plus Qwen2.5's tool block, tool
# calls and grouped tool responses (Qwen2.5-VL's own template has no tools). Content may be a
# string or a list of parts in any role, so a tool response can carry an image.
QWEN_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}"
    "{%- set video_count = namespace(value=0) %}"
    "{%- macro render_content(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- elif content is none %}"
    "{%- else %}"
    "{%- for part in content %}"
    "{%- if part is string %}{{- part }}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{%- set video_count.value = video_count.value + 1 %}"
    "{%- if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part %}{{- part['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- endmacro %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_text = render_content(messages[0]['content']) %}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{%- set system_text = 'You are a helpful assistant.' %}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + system_text }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>\' }}'
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + render_content(message['content']) + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- set text = render_content(message['content']) %}"
    "{%- if text %}{{- '\\n' + text }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}"
    "{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + render_content(message['content'])"
    " + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Text the BPE is trained on: enough English, digits, punctuation and tool-call JSON that
# prompts tokenize into a few tokens per word instead of one per byte.
_CORPUS_LINES = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Output only the final answer itself.",
    "Do not include explanations, reasoning, labels, or any extra text.",
    "You decide based on answer reliability.",
    'Answer "yes" if using a tool would significantly improve correctness or confidence.',
    'Answer "no" if tools would add little or no value. Output only "yes" or "no".',
    "Would tools significantly improve answer reliability? yes or no.",
    "Think first, call image_zoom_in_tool if needed, then answer. Format strictly as:",
    "What is the color of the small square near the corner of the image?",
    "What is the colour of the object? Answer with the option's letter from the given choices.",
    "Question: Which object is on the left? Options: A. red B. blue C. green D. yellow",
    "Answer: A",
    "Answer: B",
    "Answer: C",
    "Answer: D",
    "The answer is yes. The answer is no. The answer is red, blue, green or yellow.",
    "red blue green yellow black white orange purple pink brown gray grey",
    "yes no Yes No YES NO A B C D E F true false null none",
    "left right top bottom up down above below near far small large big tiny",
    "image picture photo region box crop zoom label object text sign number count",
    "the a an of in on at to for with by from is are was were be it this that",
    "what which where when who how why many much there here",
    "0 1 2 3 4 5 6 7 8 9 10 12 20 25 32 50 64 99 100 128 200 256 480 512 640 720 1000 1280",
    "3.14 0.5 1.0 -1 +1 10% $5 #1 @user a_b x-y (1, 2) [3, 4] {5: 6} <7> 8/9 10\\11",
    ". , ; : ! ? ' \" ` ~ - _ = + * & ^ % $ # @ | / \\ ( ) [ ] { } < >",
    '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4]}}',
    '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": '
    '"the apple on the desk"}}',
    '{"type": "function", "function": {"name": "image_zoom_in_tool", "description": "Zoom in '
    'on a specific region of an image by cropping it based on a bounding box.", "parameters": '
    '{"type": "object", "properties": {"bbox_2d": {"type": "array", "items": {"type": '
    '"number"}}, "label": {"type": "string"}}, "required": ["bbox_2d"]}}}',
    '{"name": "ocr", "arguments": {"bbox_2d": [0, 0, 640, 480]}}',
    '{"name": "rotate", "arguments": {"angle": 90}}',
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n",
    "You are provided with function signatures within XML tags:\n",
    "For each function call, return a json object with function name and arguments.\n",
    "Zoomed image of the region. The crop shows a red square.\n",
    "Hello world! How are you today? I am fine, thank you.\n",
    "The quick brown fox jumps over the lazy dog.\n",
    "  indented line\n\ttabbed line\n\n",
)


def _corpus(extra: Sequence[str] = ()) -> list[str]:
    """The training text, repeated so every piece clears the trainer's ``min_frequency``."""
    return [line for _ in range(4) for line in (*_CORPUS_LINES, *extra)]


def build_tokenizer(
    vocab_size: int = 768, extra_corpus: Sequence[str] = (), extra_tokens: Sequence[str] = ()
) -> Any:
    """Train a byte-level BPE locally and wrap it as a ``Qwen2Tokenizer``.

    It uses Qwen2's exact normalizer / pre-tokenizer / decoder, because transformers 5 rebuilds
    a ``Qwen2Tokenizer`` from vocab + merges on load: any other pipeline would silently change
    after a save/load round trip. The full byte alphabet makes every string encodable, and the
    ByteLevel decoder makes ``decode(encode(s)) == s``. Left padding is set here, and saved,
    because batched generation with right padding appends after the pad tokens.
    ``extra_tokens`` become whole tokens wherever they stand as a word (the demo's box
    coordinates: Qwen's pre-tokenizer otherwise splits numbers into single digits); one that
    starts with a space (" top-left") matches with that space, after any word.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    bpe.train_from_iterator(_corpus(extra_corpus), trainer=trainer)
    bpe_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in bpe_json["merges"]]
    vocab = dict(bpe_json["vocab"])
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        vocab[t] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        # transformers annotates merges as str | list[str] and unk_token as str, but passes
        # merges on to tokenizers' BPE (which takes these pairs) and allows no unk token
        merges=merges,  # type: ignore[arg-type]
        unk_token=None,  # type: ignore[arg-type]
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        errors="replace",
    )
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True) for t in SPECIAL_TOKENS]}
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.add_tokens([_added(t) for t in extra_tokens])
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def _added(token: str) -> Any:
    """An added token as ``build_tokenizer`` adds it (single-word matching would never match
    a token that starts with a space)."""
    from transformers import AddedToken

    return AddedToken(token, special=False, normalized=False, single_word=not token.startswith(" "))


def _token_ids(tok: Any) -> dict[str, int]:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }


# Text tower shared by both sizes. head_dim 16 -> mrope_section must sum to head_dim / 2 = 8.
_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
_MROPE_SECTION = [2, 3, 3]


def build_qwen_vl(
    kind: str,
    tok: Any,
    text: dict[str, Any],
    vision: dict[str, Any],
    *,
    tie: bool = True,
    init_std: float | None = None,
    dtype: Any = None,
) -> Any:
    """A random Qwen2.5-VL ("large") or Qwen3-VL ("small") model wired to ``tok``.

    Fills in what must agree with the tokenizer (special token ids, vocabulary size unless
    given) and a greedy generation config stopping at ``<|im_end|>`` or pad. Shared by the
    tiny test checkpoints, the demo training and the full-size GPU benchmark.
    """
    from transformers import (
        AutoModelForImageTextToText,
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    ids = _token_ids(tok)
    specials = {k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    placeholders = {k: v for k, v in ids.items() if k not in specials}
    text = {"vocab_size": len(tok), **text, **specials}
    vision = dict(vision)
    extra: dict[str, Any] = {}
    if init_std is not None:
        text["initializer_range"] = vision["initializer_range"] = init_std
        if kind == "large":
            extra["initializer_range"] = init_std
    # two model families whose config signatures differ: called through Any
    families: dict[str, tuple[Any, Any]] = {
        "large": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
        "small": (Qwen3VLConfig, Qwen3VLForConditionalGeneration),
    }
    config_cls, model_cls = families[kind]
    config = config_cls(
        text_config=text, vision_config=vision, tie_word_embeddings=tie, **extra, **placeholders
    )
    model = (
        AutoModelForImageTextToText.from_config(config, dtype=dtype)
        if dtype is not None
        else model_cls(config)
    )
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos_token_id"],
        eos_token_id=[ids["eos_token_id"], ids["pad_token_id"]],
        pad_token_id=ids["pad_token_id"],
        do_sample=False,
    )
    return model.eval()


# Tiny towers: vision out_hidden_size = text hidden size; patch 14 (Qwen2.5-VL) / 16 (Qwen3-VL).
_TINY_VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": _TEXT["hidden_size"],
}
TINY_ARCH = {
    "large": (
        {
            **_TEXT,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": list(_MROPE_SECTION),
            },
        },
        {
            **_TINY_VISION,
            "patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "tokens_per_second": 2,
        },
    ),
    "small": (
        {
            **_TEXT,
            "head_dim": _TEXT["hidden_size"] // _TEXT["num_attention_heads"],
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": list(_MROPE_SECTION),
                "mrope_interleaved": True,
            },
        },
        # learned positions: an 8x8 grid (a square count), interpolated to any image; one deepstack layer
        {
            **_TINY_VISION,
            "patch_size": 16,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
    ),
}


def _processor(kind: str, tok: Any, min_pixels: int, max_pixels: int) -> Any:
    """The real processor classes, with pixel budgets tiny enough for CPU tests.

    transformers 5 reads the budget from ``size={"shortest_edge": min_pixels, "longest_edge":
    max_pixels}`` (``min_pixels``/``max_pixels`` kwargs are only a constructor shim), so ``size``
    is what gets saved and must carry the budget.
    """
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    patch = 14 if kind == "large" else 16
    geometry = {"patch_size": patch, "merge_size": 2, "temporal_patch_size": 2}
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(size=dict(size), **geometry)
    video_cls = Qwen2VLVideoProcessor if kind == "large" else Qwen3VLVideoProcessor
    video_processor = video_cls(
        size={"shortest_edge": min_pixels, "longest_edge": 4 * max_pixels}, **geometry
    )
    proc_cls = Qwen2_5_VLProcessor if kind == "large" else Qwen3VLProcessor
    return proc_cls(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        chat_template=QWEN_CHAT_TEMPLATE,
    )


def make_tiny_models(
    out_dir: str | Path,
    *,
    seed: int = 0,
    image_max_pixels: int = 112 * 112 * 4,
    init_std: float = 0.3,
) -> dict[str, Path]:
    """Write ``out_dir/small`` (Qwen3-VL) and ``out_dir/large`` (Qwen2.5-VL); return their paths.

    Deterministic for a given ``seed`` (same bytes on disk), so tests can compare runs.
    ``image_max_pixels`` caps the large model's image area; the small model gets the same
    number of vision tokens (its patches are 16 px instead of 14, hence the 256/196 factor).
    ``init_std`` is large on purpose: with the usual 0.02 a random model's next-token
    distribution is flat and greedy decoding repeats one token whatever the input, which
    would make batched-vs-unbatched and routing tests vacuous.
    """
    import torch

    out = Path(out_dir)
    tok = build_tokenizer()
    budgets = {
        "large": (56 * 56, image_max_pixels),
        "small": (64 * 64, image_max_pixels * 256 // 196),
    }
    paths: dict[str, Path] = {}
    for kind in ("small", "large"):
        path = out / kind
        torch.manual_seed(seed)
        model = build_qwen_vl(kind, tok, *TINY_ARCH[kind], init_std=init_std)
        _quiet_save(model, path)
        _processor(kind, tok, *budgets[kind]).save_pretrained(path)
        paths[kind] = path
    return paths


def _quiet_save(model: Any, path: Path) -> None:
    """save_pretrained without its per-shard progress bar (noise for a 1 MB file)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def cached_tiny_models(seed: int = 0) -> dict[str, Path]:
    """The tiny checkpoints in a per-user cache (built once, atomically; ~2 MB).

    The cache is ``$SPECEYES_CACHE`` or ``$XDG_CACHE_HOME/speceyes-graph`` (default
    ``~/.cache/speceyes-graph``). Examples and smoke runs use this instead of rebuilding.
    """
    import os
    import shutil
    import tempfile

    base = Path(
        os.environ.get("SPECEYES_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speceyes-graph"
    )
    target = base / f"tiny-seed{seed}"
    if (
        not (target / "small" / "config.json").exists()
        or not (target / "large" / "config.json").exists()
    ):
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".building-"))
        make_tiny_models(tmp, seed=seed)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return {"small": target / "small", "large": target / "large"}
