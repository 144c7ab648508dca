"""The frame an image is sent in, and the frame a model's boxes are in, by checkpoint family.

A local ``ChatTransformersVLM`` reads its frame from its processor (:func:`processor_resize`).
For a served model the graph must know what the server's processor will do: the image is
sent already resized within those limits (so the boxes the model writes are in a frame we can
map back exactly), and sending it smaller than the model would see it costs accuracy on
exactly the high-resolution benchmarks. :mod:`.served` asks the server which checkpoint it
loaded and reads the same processor config; when that config cannot be read here, the
family's limits below (those of the families' processor configs) stand in.

Each family's processor has its own rule, and the frame follows it, never another family's:

- Qwen-VL (``Qwen2VLImageProcessor``): sides multiples of patch x merge, area within
  ``min_pixels``..``max_pixels``. The image is sent in exactly that frame.
- Pixtral (Mistral 3): the longer side at most ``longest_edge``, sides rounded up to the
  patch. The image is sent in exactly that frame too.
- Every other family tiles the image (Idefics3, SmolVLM, LLaVA-NeXT, LLaVA-OneVision,
  InternVL, Llama 3.2 Vision) or squashes it to a square (Gemma 3, PaliGemma): no frame of the image survives
  whole, so it is sent as it is, bounded by the most pixels the processor uses.

Where boxes map back: :func:`box_convention` says how a family's instruct checkpoints write
boxes, where that is documented; elsewhere it is unknown, and the graph says so
(:func:`speceyes_graph.graph.options.resolve_models`) instead of guessing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from speceyes_tools.geometry import Coordinates
from speceyes_tools.images import ResizeSpec

__all__ = ["FAMILIES", "box_convention", "family_of", "family_resize", "processor_resize"]

log = logging.getLogger(__name__)


def _bounded(max_pixels: int) -> ResizeSpec:
    """The frame of a family that tiles or squashes: the image as it is, at most this big."""
    return ResizeSpec(factor=1, min_pixels=1, max_pixels=max_pixels)


# The frames of the published processor configs, for a served checkpoint whose config this
# machine cannot read (docs/models.md gives the sources).
FAMILIES: dict[str, ResizeSpec] = {
    # Qwen2-VL / Qwen2.5-VL and their fine-tunes (DeepEyes, Thyme): 14 px patches, 2x2 merge
    "qwen2.5-vl": ResizeSpec(factor=28, min_pixels=3136, max_pixels=12845056),
    # Qwen3-VL: 16 px patches, 2x2 merge
    "qwen3-vl": ResizeSpec(factor=32, min_pixels=65536, max_pixels=16777216),
    # Pixtral-12B: 16 px patches, longest edge 1024; Mistral Small 3.1/3.2: 14 px x 2x2, 1540
    "pixtral": ResizeSpec(factor=16, min_pixels=1, max_pixels=1024 * 1024, max_side=1024),
    "mistral3": ResizeSpec(factor=28, min_pixels=1, max_pixels=1540 * 1540, max_side=1540),
    "gemma3": _bounded(896 * 896),  # one 896 px square (pan and scan off)
    "paligemma-224": _bounded(224 * 224),
    "paligemma-448": _bounded(448 * 448),
    "paligemma-896": _bounded(896 * 896),
    "internvl": _bounded(12 * 448 * 448),  # up to 12 tiles of 448 px
    "idefics3": _bounded(1456 * 1456),  # longest edge 1456, then 364 px tiles
    "smolvlm": _bounded(2048 * 2048),  # longest edge 1536 (2048 for the 256M / 500M)
    "llava-next": _bounded(672 * 672),  # the largest grid of LLaVA-1.6's pinpoints
    "llava-onevision": _bounded(2304 * 2304),
    "mllama": _bounded(4 * 560 * 560),  # Llama 3.2 Vision: up to 4 tiles of 560 px
}

_ALIASES = {  # the first that a (lower-cased) name contains
    "qwen3-vl": "qwen3-vl",
    "qwen3vl": "qwen3-vl",
    "qwen2.5-vl": "qwen2.5-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen2.5vl": "qwen2.5-vl",
    "qwen2-vl": "qwen2.5-vl",
    "deepeyes": "qwen2.5-vl",
    "thyme": "qwen2.5-vl",
    "pixtral": "pixtral",
    "mistral-small-3": "mistral3",
    "magistral-small": "mistral3",
    "gemma-3": "gemma3",
    "gemma3": "gemma3",
    "internvl": "internvl",
    "idefics3": "idefics3",
    "smolvlm": "smolvlm",
    "llava-onevision": "llava-onevision",
    "llava-v1.6": "llava-next",
    "llava-next": "llava-next",
    "llama-3.2-11b-vision": "mllama",
    "llama-3.2-90b-vision": "mllama",
    "mllama": "mllama",
}

# How boxes are written, by the checkpoint's ``config.model_type``, where documented:
# Qwen2-VL / Qwen2.5-VL ground in pixels of the resized image (DeepEyes and Thyme are trained
# so), Qwen3-VL in relative 0-1000 coordinates, InternVL in [0, 1000) normalised ones.
_BOXES: dict[str, Coordinates] = {
    "qwen2_vl": "model",
    "qwen2_5_vl": "model",
    "qwen3_vl": "thousand",
    "qwen3_vl_moe": "thousand",
    "internvl": "thousand",
}
_MODEL_TYPES = {"qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl", "internvl": "internvl"}


def family_of(model_name: str) -> str | None:
    """The family a model name belongs to, from its (hub-style) name."""
    name = model_name.lower()
    if "paligemma" in name:  # one family, three square sizes, named in the checkpoint
        return next((f"paligemma-{px}" for px in (896, 448) if str(px) in name), "paligemma-224")
    for alias, family in _ALIASES.items():
        if alias in name:
            return family
    return None


def family_resize(model_name: str) -> ResizeSpec:
    """The family's limits, or the 1-megapixel default (with a warning) for an unknown name."""
    family = family_of(model_name)
    if family is None:
        log.warning(
            "unknown model family for %r: images go out at most %d pixels; set max_pixels to "
            "what its processor uses",
            model_name,
            ResizeSpec().max_pixels,
        )
        return ResizeSpec()
    return FAMILIES[family]


def box_convention(model_type: str | None) -> Coordinates | None:
    """How a family's checkpoints write boxes (see :data:`~speceyes_tools.geometry.Coordinates`),
    by ``config.model_type`` or by family name; None where no convention is documented."""
    return _BOXES.get(model_type or "") or _BOXES.get(_MODEL_TYPES.get(model_type or "", ""))


def _kind(image_processor: Any) -> str:
    """The image processor's class name (an instance's, or a config's ``image_processor_type``)
    without the Fast suffix: what decides which family's rule applies."""
    if isinstance(image_processor, Mapping):
        name = str(image_processor.get("image_processor_type") or "")
    else:
        name = next(
            (c.__name__ for c in type(image_processor).__mro__ if "ImageProcessor" in c.__name__),
            type(image_processor).__name__,
        )
    return name.removesuffix("Fast")


def processor_resize(image_processor: Any, patch: int | None = None) -> ResizeSpec:
    """The frame an image is sent in, from an image processor or its config dict (a checkpoint's
    ``preprocessor_config.json``), by that processor's own rule (see the module's docstring).

    ``patch`` is the side multiple a Pixtral *processor* passes its image processor (its
    ``patch_size`` x ``spatial_merge_size``: Mistral 3 keeps them there, not in the image
    processor's config).
    """

    def get(key: str, default: Any = None) -> Any:
        if isinstance(image_processor, Mapping):
            return image_processor.get(key, default)
        return getattr(image_processor, key, default)

    def side(value: Any) -> int:
        """A patch or tile side given as an int or as ``{"height": h, "width": w}``."""
        if isinstance(value, Mapping):
            value = value.get("height") or value.get("width") or value.get("longest_edge")
        return int(value)

    kind = _kind(image_processor)
    size = get("size") or {}
    if kind.startswith("Qwen2VLImageProcessor") or get("merge_size") and get("temporal_patch_size"):
        factor = int(side(get("patch_size")) * (get("merge_size") or 2))
        min_pixels = int(size.get("shortest_edge") or get("min_pixels") or factor * factor)
        max_pixels = int(size.get("longest_edge") or get("max_pixels") or 1280 * factor * factor)
        return ResizeSpec(factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    if kind.startswith("PixtralImageProcessor"):
        patch = patch or side(get("patch_size") or 16)
        longest = int(size.get("longest_edge") or 1024)
        return ResizeSpec(
            factor=patch, min_pixels=1, max_pixels=longest * longest, max_side=longest
        )
    return ResizeSpec(factor=1, min_pixels=1, max_pixels=_most_pixels(get, size, kind))


def _most_pixels(get: Any, size: Mapping, kind: str) -> int:
    """The most pixels of an image a tiling or squashing processor makes use of."""
    pinpoints = get("image_grid_pinpoints")  # LLaVA-NeXT / OneVision: the largest grid
    if pinpoints:
        return int(max(h * w for h, w in pinpoints))
    tile = int(size.get("height") or 0) * int(size.get("width") or 0)
    if get("max_patches") and tile:  # InternVL (GotOcr2): up to max_patches tiles (its
        return int(get("max_patches")) * tile  # processor turns crop_to_patches on per call)
    if get("max_image_tiles") and tile:  # Llama 3.2 Vision: up to max_image_tiles tiles
        return int(get("max_image_tiles")) * tile
    if tile:  # Gemma 3, PaliGemma, SigLIP: one square
        return tile
    longest = size.get("longest_edge")  # Idefics3 / SmolVLM: the longer side, then tiles
    if longest:
        return int(longest) * int(longest)
    shortest = size.get("shortest_edge")
    if shortest:
        return int(shortest) * int(shortest)
    default = ResizeSpec().max_pixels
    log.warning(
        "no image size in the %s config: images go out at most %d pixels (%d x %d)",
        kind or "image processor",
        default,
        math.isqrt(default),
        math.isqrt(default),
    )
    return default
