"""Image size limits: from a processor's settings, or by checkpoint family.

A local ``ChatTransformersVLM`` reads its limits from its processor (:func:`processor_resize`).
For a served model the graph must know what the server's processor will do: the image is
sent already resized within those limits (so the boxes the model writes are in a frame we can
map back exactly), and sending it smaller than the model would see it costs accuracy on
exactly the high-resolution benchmarks. :mod:`.served` asks the server which checkpoint it
loaded; when that checkpoint's config cannot be read here, the family's limits below (those
of the families' processor configs) stand in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from speceyes_tools.images import ResizeSpec

__all__ = ["FAMILIES", "family_of", "family_resize", "processor_resize"]

log = logging.getLogger(__name__)

FAMILIES: dict[str, ResizeSpec] = {
    # Qwen2-VL / Qwen2.5-VL and their fine-tunes (DeepEyes, Thyme): 14 px patches, 2x2 merge
    "qwen2.5-vl": ResizeSpec(factor=28, min_pixels=3136, max_pixels=12845056),
    # Qwen3-VL: 16 px patches, 2x2 merge
    "qwen3-vl": ResizeSpec(factor=32, min_pixels=65536, max_pixels=16777216),
}

_ALIASES = {
    "qwen3-vl": "qwen3-vl",
    "qwen3vl": "qwen3-vl",
    "qwen2.5-vl": "qwen2.5-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen2.5vl": "qwen2.5-vl",
    "qwen2-vl": "qwen2.5-vl",
    "deepeyes": "qwen2.5-vl",
    "thyme": "qwen2.5-vl",
}


def family_of(model_name: str) -> str | None:
    """The family a model name belongs to, from its (hub-style) name."""
    name = model_name.lower()
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


def processor_resize(image_processor: Any) -> ResizeSpec:
    """The frame a Qwen-VL image processor resizes to, from the processor or its config dict
    (``size`` with ``shortest_edge``/``longest_edge`` in pixels, or ``min_pixels``/``max_pixels``;
    ``patch_size`` times ``merge_size`` is the side multiple)."""

    def get(key: str, default: Any = None) -> Any:
        if isinstance(image_processor, Mapping):
            return image_processor.get(key, default)
        return getattr(image_processor, key, default)

    size = get("size") or {}
    factor = int(get("patch_size") * (get("merge_size") or 2))
    min_pixels = int(size.get("shortest_edge") or get("min_pixels") or factor * factor)
    max_pixels = int(size.get("longest_edge") or get("max_pixels") or 1280 * factor * factor)
    return ResizeSpec(factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
