"""Tiny random checkpoints of eleven image-text-to-text families, built offline.

``make_tiny_family(family, out)`` writes a folder that ``AutoProcessor.from_pretrained(out)`` and
``AutoModelForImageTextToText.from_pretrained(out)`` load exactly as they would load the real
instruct checkpoint of that family: the real configuration, model, image processor, processor
and (as near as transformers 5 allows) tokenizer classes, the real chat template and the real
special tokens, but a vocabulary of about a thousand byte-level or byte-fallback BPE pieces
trained here and a few hundred thousand random weights.

Why: code that claims to work with "any image-text-to-text checkpoint" breaks on what differs
between families -- how many placeholder tokens an image expands to, whether images are tiled,
whether the tokenizer adds a BOS token that the chat template also writes, what ends a turn --
and none of that can be tested against Qwen alone or downloaded in a sandbox. The processors'
behaviour is what these fixtures are faithful to; the weights are noise, initialised with a
large standard deviation so that greedy decoding depends on the input instead of repeating one
token.

Families (``FAMILIES``) and the checkpoint each imitates:

==================  ==================================================  =======================
family              imitates                                            tokenizer adds BOS
==================  ==================================================  =======================
qwen2.5-vl          Qwen/Qwen2.5-VL-*-Instruct (``demo.tiny``)          no
qwen3-vl            Qwen/Qwen3-VL-*-Instruct (``demo.tiny``)            no
idefics3            HuggingFaceM4/Idefics3-8B-Llama3                    yes, ``<|begin_of_text|>``
smolvlm             HuggingFaceTB/SmolVLM2-2.2B-Instruct                no
llava-onevision     llava-hf/llava-onevision-qwen2-0.5b-ov-hf           no
gemma3              google/gemma-3-4b-it                                yes, ``<bos>``
internvl            OpenGVLab/InternVL3-1B-hf                           no
mistral3            mistralai/Mistral-Small-3.1-24B-Instruct-2503       yes, ``<s>``
paligemma           google/paligemma-3b-mix-224                         processor inserts ``<bos>``
llava-next          llava-hf/llava-v1.6-mistral-7b-hf                   yes, ``<s>``
mllama              meta-llama/Llama-3.2-11B-Vision-Instruct            yes, ``<|begin_of_text|>``
==================  ==================================================  =======================

Quirks the fixtures keep, because the real checkpoints have them:

- Idefics3, Gemma 3, Mistral 3 and Llama 3.2 Vision templates write the BOS token and their tokenizers add it
  too: ``processor.apply_chat_template(..., tokenize=True)`` gives one BOS, but rendering the
  template and then calling ``processor(text=...)`` gives two.
- PaliGemma has no chat template (pass ``PALIGEMMA_CHAT_TEMPLATE``); its processor turns the
  tokenizer's BOS off on every load and inserts ``<bos>`` after the image tokens.
- SmolVLMProcessor needs the ``num2words`` package to load (it spells video frame counts),
  as the real checkpoint does.
- Gemma 3's and Mistral 3.1's templates reject a ``tool`` role; LLaVA-NeXT's accepts only
  user/assistant/system.
- Llama 3.2 Vision's template raises on a system message beside an image, even an empty one
  (its list content trims to the list's repr); without an image it writes the list's repr as
  the system text. Its images reach the text through cross-attention, not placeholders: one
  ``<|image|>`` per image and a 4-D ``cross_attention_mask`` [batch, tokens, images, tiles].

Deviations, for a tiny random model to be useful: Gemma 3's head is untied from its
embeddings, weight matrices a model initialises to zero are randomised, and so are Llama 3.2
Vision's tanh gates (zero until training opens them: closed, no image reaches the text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from speceyes_graph.demo.family_templates import CHAT_TEMPLATES, PALIGEMMA_CHAT_TEMPLATE
from speceyes_graph.demo.family_tokenizers import (
    gemma3_tokenizer,
    llama2_tokenizer,
    llama3_tokenizer,
    llama32_vision_tokenizer,
    paligemma_tokenizer,
    qwen2_tokenizer,
    smollm2_tokenizer,
    tekken_tokenizer,
)
from speceyes_graph.demo.tiny import (
    TINY_ARCH,
    _processor,
    _quiet_save,
    build_qwen_vl,
    build_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATES",
    "FAMILIES",
    "PALIGEMMA_CHAT_TEMPLATE",
    "make_tiny_family",
]

FAMILIES: tuple[str, ...] = (
    "qwen2.5-vl",
    "qwen3-vl",
    "idefics3",
    "smolvlm",
    "llava-onevision",
    "gemma3",
    "internvl",
    "mistral3",
    "paligemma",
    "llava-next",
    "mllama",
)

# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

_INIT_STD = 0.3  # large on purpose: with 0.02 greedy decoding repeats one token whatever the input

# One tiny decoder for every family: head_dim 16.
_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes 32 and up: these serve (tests/test_vllm.py)
    "max_position_embeddings": 4096,
    "initializer_range": _INIT_STD,
}
# One tiny vision transformer (the families' towers differ in kind, not here in size).
_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "initializer_range": _INIT_STD,
}


def _generation_config(tok: Any, eos: Sequence[str]) -> Any:
    """Greedy decoding that stops at the family's end-of-turn token(s), padding with pad."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.convert_tokens_to_ids(t) for t in eos],
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )


def _randomize_zero_matrices(model: Any) -> None:
    """Give random values to the weight matrices a model initialises to zero.

    Some are zero only until training (Gemma 3's image projection, InternViT's position
    embeddings and class token); left at zero, the image would not reach the text at all.
    Norm weights and biases (1-D) keep their initial values.
    """
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and not param.any():
                param.normal_(0.0, _INIT_STD)


def _save(model: Any, processor: Any, tok: Any, eos: Sequence[str], out: Path) -> None:
    """Write model (with a greedy generation config stopping at ``eos``) and processor."""
    _randomize_zero_matrices(model)
    model.generation_config = _generation_config(tok, eos)
    _quiet_save(model.eval(), out)
    processor.save_pretrained(out)


def _text_config(tok: Any, **overrides: Any) -> dict[str, Any]:
    """The tiny decoder's config, its vocabulary and special ids taken from ``tok``."""
    return {
        **_TEXT,
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **overrides,
    }


# Every vision tower uses 8 px patches; tiles are 32 px (4x4 patches) or 48 px (6x6).
_PATCH = 8


def _build_qwen(kind: str, out: Path) -> None:
    """tiny.py's Qwen-VL builds ("large" is Qwen2.5-VL, "small" Qwen3-VL), one per folder."""
    tok = build_tokenizer()
    model = build_qwen_vl(kind, tok, *TINY_ARCH[kind], init_std=_INIT_STD)
    budgets = {"large": (56 * 56, 112 * 112 * 4), "small": (64 * 64, 112 * 112 * 4 * 256 // 196)}
    _quiet_save(model, out)
    _processor(kind, tok, *budgets[kind]).save_pretrained(out)


def _build_idefics3(out: Path) -> None:
    """Idefics3: 32 px tiles of 4x4 patches, pixel-shuffled by 2 into 4 tokens each; images
    are upscaled to a 128 px longest edge and split into up to 4x4 tiles plus a global view
    (the real ratios: 1456 / 364 px)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    tile, scale = 32, 2
    tok = llama3_tokenizer(CHAT_TEMPLATES["idefics3"])
    image_seq_len = (tile // _PATCH) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessor(
            size={"longest_edge": 4 * tile},
            max_image_size={"longest_edge": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        ),
        tokenizer=tok,
        image_seq_len=image_seq_len,
        chat_template=CHAT_TEMPLATES["idefics3"],
    )
    config = Idefics3Config(
        vision_config={**_VISION, "image_size": tile, "patch_size": _PATCH},
        text_config={"model_type": "llama", **_text_config(tok), "rope_theta": 500000.0},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = Idefics3ForConditionalGeneration(config)
    _save(model, processor, tok, ("<end_of_utterance>", "<|end_of_text|>"), out)


def _build_smolvlm(out: Path) -> None:
    """SmolVLM2: 48 px tiles of 6x6 patches, pixel-shuffled by 3 into 4 tokens each (the
    2.2B's scale factor), split from a 192 px longest edge (the real 1536 / 384 px)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    tile, scale = 48, 3
    tok = smollm2_tokenizer(CHAT_TEMPLATES["smolvlm"])
    image_seq_len = (tile // _PATCH) ** 2 // scale**2
    image_processor = SmolVLMImageProcessor(
        size={"longest_edge": 4 * tile},
        max_image_size={"longest_edge": tile},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    video_processor = SmolVLMVideoProcessor(
        size={"longest_edge": tile}, max_image_size={"longest_edge": tile}
    )
    processor = SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        image_seq_len=image_seq_len,
        chat_template=CHAT_TEMPLATES["smolvlm"],
    )
    config = SmolVLMConfig(
        vision_config={**_VISION, "image_size": tile, "patch_size": _PATCH},
        text_config={"model_type": "llama", **_text_config(tok), "rope_theta": 130000.0},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = SmolVLMForConditionalGeneration(config)
    _save(model, processor, tok, ("<end_of_utterance>",), out)


def _pinpoints(tile: int, n: int) -> list[list[int]]:
    return [[tile * i, tile * j] for i in range(1, n + 1) for j in range(1, n + 1)]


def _build_llava_onevision(out: Path) -> None:
    """LLaVA-OneVision: SigLIP on 32 px tiles (16 tokens, all kept), anyres over a 6x6 grid of
    tiles with the anyres_max_9 downsampling, base features only for multi-image prompts."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tile = 32
    tok = qwen2_tokenizer(
        CHAT_TEMPLATES["llava-onevision"],
        ("<image>", "<video>"),
        {"image_token": "<image>", "video_token": "<video>"},
    )
    pinpoints = _pinpoints(tile, 6)
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(
            size={"height": tile, "width": tile},
            image_grid_pinpoints=pinpoints,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        ),
        tokenizer=tok,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": tile, "width": tile}),
        num_image_tokens=(tile // _PATCH) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=CHAT_TEMPLATES["llava-onevision"],
    )
    config = LlavaOnevisionConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "vision_use_head": False,
        },
        text_config={"model_type": "qwen2", **_text_config(tok)},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=True,
    )
    model = LlavaOnevisionForConditionalGeneration(config)
    _save(model, processor, tok, ("<|im_end|>", "<|endoftext|>"), out)


def _build_gemma3(out: Path) -> None:
    """Gemma 3: SigLIP on a fixed 32 px square (4x4 patches), average-pooled to 2x2 = 4 soft
    tokens between <start_of_image> and <end_of_image>; pan-and-scan off (its default)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    tile, tokens = 32, 4
    tok = gemma3_tokenizer(CHAT_TEMPLATES["gemma3"])
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(
            size={"height": tile, "width": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            do_pan_and_scan=None,
        ),
        tokenizer=tok,
        image_seq_length=tokens,
        chat_template=CHAT_TEMPLATES["gemma3"],
    )
    config = Gemma3Config(
        text_config={
            **_text_config(tok),
            "tie_word_embeddings": False,
            "query_pre_attn_scalar": _TEXT["head_dim"],
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "vision_use_head": False,
        },
        mm_tokens_per_image=tokens,
        # untied (the real one ties): with a tiny model, Gemma's sqrt(hidden) embedding scale
        # and a tied head make every position predict its own input token
        tie_word_embeddings=False,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        initializer_range=_INIT_STD,
    )
    model = Gemma3ForConditionalGeneration(config)
    _save(model, processor, tok, ("<eos>", "<end_of_turn>"), out)


def _build_internvl(out: Path) -> None:
    """InternVL3: 32 px tiles of 4x4 patches, pixel-shuffled by 0.5 into 4 <IMG_CONTEXT>
    tokens each; crop_to_patches splits an image into 1-12 tiles plus a thumbnail."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    tile = 32
    names = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    extra = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>")
    tok = qwen2_tokenizer(CHAT_TEMPLATES["internvl"], (*extra, "<box>", "</box>", "<video>"), names)
    image_seq_length = (tile // _PATCH) ** 2 // 4
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size={"height": tile, "width": tile},
            crop_to_patches=False,  # as saved on the Hub; InternVLProcessor turns it on per call
            min_patches=1,
            max_patches=12,
            image_mean=[0.485, 0.456, 0.406],
            image_std=[0.229, 0.224, 0.225],
        ),
        tokenizer=tok,
        video_processor=InternVLVideoProcessor(size={"height": tile, "width": tile}),
        image_seq_length=image_seq_length,
        chat_template=CHAT_TEMPLATES["internvl"],
    )
    config = InternVLConfig(
        vision_config={
            **_VISION,
            "image_size": [tile, tile],
            "patch_size": [_PATCH, _PATCH],
            "use_absolute_position_embeddings": True,
        },
        text_config={"model_type": "qwen2", **_text_config(tok)},
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=image_seq_length,
        downsample_ratio=0.5,
        tie_word_embeddings=True,
    )
    model = InternVLForConditionalGeneration(config)
    _save(model, processor, tok, ("<|im_end|>", "<|endoftext|>"), out)


def _build_mistral3(out: Path) -> None:
    """Mistral Small 3.1: Pixtral keeps the aspect ratio, shrinks to a 64 px longest edge and
    rounds up to 16 px (8 px patches merged 2x2), one [IMG] per merged patch, [IMG_BREAK]
    after each row and [IMG_END] last."""
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralImageProcessor,
        PixtralProcessor,
    )

    longest, merge = 64, 2
    tok = tekken_tokenizer(CHAT_TEMPLATES["mistral3"])
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": longest},
            patch_size={"height": _PATCH, "width": _PATCH},
        ),
        tokenizer=tok,
        patch_size=_PATCH,
        spatial_merge_size=merge,
        chat_template=CHAT_TEMPLATES["mistral3"],
    )
    config = Mistral3Config(
        vision_config={
            "model_type": "pixtral",
            **_VISION,
            "head_dim": _VISION["hidden_size"] // _VISION["num_attention_heads"],
            "image_size": longest,
            "patch_size": _PATCH,
        },
        text_config={"model_type": "mistral", **_text_config(tok), "sliding_window": None},
        image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=merge,
        tie_word_embeddings=False,
    )
    model = Mistral3ForConditionalGeneration(config)
    _save(model, processor, tok, ("</s>",), out)


def _build_paligemma(out: Path) -> None:
    """PaliGemma: SigLIP on a fixed 32 px square, 16 <image> tokens; no chat template."""
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
    )

    tile = 32
    tok = paligemma_tokenizer()
    tokens = (tile // _PATCH) ** 2
    processor = PaliGemmaProcessor(
        image_processor=SiglipImageProcessor(
            size={"height": tile, "width": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            image_seq_length=tokens,
        ),
        tokenizer=tok,
    )
    hidden = _TEXT["hidden_size"]
    config = PaliGemmaConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "projection_dim": hidden,
            "vision_use_head": False,
        },
        text_config={"model_type": "gemma", **_text_config(tok)},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vocab_size=len(tok),
        projection_dim=hidden,
        hidden_size=hidden,
        tie_word_embeddings=True,
    )
    model = PaliGemmaForConditionalGeneration(config)
    # The processor switched the tokenizer's BOS off (it inserts <bos> itself, after the image
    # tokens, and does so again on every load); the Hub tokenizer adds it when used alone.
    tok.add_bos_token = True
    _save(model, processor, tok, ("<eos>",), out)


def _build_llava_next(out: Path) -> None:
    """LLaVA-NeXT: CLIP on 32 px tiles (16 patches + CLS, the CLS dropped), anyres over the
    real pinpoints' shapes (1x2, 2x1, 2x2, 3x1, 1x3 tiles), unpadded, with a newline column."""
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tile = 32
    tok = llama2_tokenizer(CHAT_TEMPLATES["llava-next"])
    pinpoints = [[tile * h, tile * w] for h, w in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(
            size={"shortest_edge": tile},
            crop_size={"height": tile, "width": tile},
            image_grid_pinpoints=pinpoints,
        ),
        tokenizer=tok,
        patch_size=_PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATES["llava-next"],
    )
    config = LlavaNextConfig(
        vision_config={
            "model_type": "clip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "projection_dim": _TEXT["hidden_size"],
        },
        text_config={"model_type": "mistral", **_text_config(tok), "sliding_window": None},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=(tile // _PATCH) ** 2,
        tie_word_embeddings=False,
    )
    model = LlavaNextForConditionalGeneration(config)
    _save(model, processor, tok, ("</s>",), out)


def _build_mllama(out: Path) -> None:
    """Llama 3.2 Vision: each image is resized to the best grid of up to 4 tiles of 32 px
    (the real 560 px) and every tile encoded apart (4x4 patches + CLS, padded to 24 tokens);
    the decoder reads them through gated cross-attention layers, not placeholders: the prompt
    holds one ``<|image|>`` per image, and a 4-D ``cross_attention_mask`` [batch, tokens,
    images, tiles] says which tokens see which image."""
    from transformers import (
        MllamaConfig,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        MllamaProcessor,
    )

    tile, tiles = 32, 4
    tok = llama32_vision_tokenizer(CHAT_TEMPLATES["mllama"])
    processor = MllamaProcessor(
        image_processor=MllamaImageProcessor(
            size={"height": tile, "width": tile},
            max_image_tiles=tiles,
            image_mean=[0.48145466, 0.4578275, 0.40821073],
            image_std=[0.26862954, 0.26130258, 0.27577711],
        ),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATES["mllama"],
    )
    layers = [0, 1]  # the local layers whose outputs join the last one's (real: 5 of 32)
    config = MllamaConfig(
        vision_config={
            "hidden_size": _VISION["hidden_size"],
            "intermediate_size": _VISION["intermediate_size"],
            "num_hidden_layers": _VISION["num_hidden_layers"],
            "num_global_layers": 1,
            "attention_heads": _VISION["num_attention_heads"],
            "image_size": tile,
            "patch_size": _PATCH,
            "max_num_tiles": tiles,
            "intermediate_layers_indices": layers,
            "vision_output_dim": _VISION["hidden_size"] * (len(layers) + 1),
            "initializer_range": _INIT_STD,
        },
        text_config={
            **{k: v for k, v in _text_config(tok).items() if k != "head_dim"},
            "num_hidden_layers": 3,
            "cross_attention_layers": [1],  # self, cross, self (real: every fifth of 40)
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "tie_word_embeddings": False,
        },
        image_token_index=tok.convert_tokens_to_ids("<|image|>"),
    )
    model = MllamaForConditionalGeneration(config)
    _open_gates(model)
    _save(model, processor, tok, ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), out)


def _open_gates(model: Any) -> None:
    """Give the tanh gates Llama 3.2 Vision initialises to zero (cross-attention, its MLP,
    the vision tower's position and tile embeddings) a random value: closed, no image
    reaches the text until training opens them."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "gate" in name.rsplit(".", 1)[-1] and not param.any():
                param.normal_(0.0, 1.0)


_BUILDERS: dict[str, Callable[[Path], None]] = {
    "qwen2.5-vl": lambda out: _build_qwen("large", out),
    "qwen3-vl": lambda out: _build_qwen("small", out),
    "idefics3": _build_idefics3,
    "smolvlm": _build_smolvlm,
    "llava-onevision": _build_llava_onevision,
    "gemma3": _build_gemma3,
    "internvl": _build_internvl,
    "mistral3": _build_mistral3,
    "paligemma": _build_paligemma,
    "llava-next": _build_llava_next,
    "mllama": _build_mllama,
}


def make_tiny_family(family: str, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random checkpoint of ``family`` (one of ``FAMILIES``) to ``out_dir``.

    The folder loads with ``AutoProcessor`` / ``AutoModelForImageTextToText``. Deterministic
    for a ``seed``: the same bytes on disk, so tests can compare builds and outputs.
    """
    import torch

    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    _BUILDERS[family](out)
    return out
