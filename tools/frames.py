"""The model's image frame: the size a model's processor resizes an image to.

A box a model writes is in this frame; :class:`ResizeSpec` maps it back to the original
(``speceyes_tools.geometry``), and the image store keeps one view of each image per frame
(:meth:`ImageStore.model_view <speceyes_tools.images.ImageStore.model_view>`), so the model
is sent the pixels it will see and no more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ResizeSpec", "longest_edge_resize", "smart_resize"]


@dataclass(frozen=True)
class ResizeSpec:
    """How a model's processor resizes an image before the model sees it.

    Two rules, each a family's own. Qwen-VL's (``max_side`` None): sides multiples of
    ``factor`` (patch size x spatial merge: 28 for Qwen2.5-VL, 32 for Qwen3-VL), pixel count
    within ``min_pixels``..``max_pixels`` (:func:`smart_resize`). Pixtral's (``max_side``
    set, Mistral 3): scaled down until the longer side is at most ``max_side``, then each side
    rounded up to a multiple of ``factor`` (the patch). ``factor=1, min_pixels=1`` is a frame
    that only bounds the area: the image as sent, for a family that tiles or squashes it.

    The defaults (28, up to ``1280 * 28 * 28``, about 1 MP) are only a fallback for a model
    whose frame is unknown: local checkpoints report their processor's values, served models
    their server's checkpoint (Qwen2.5-VL ships ``max_pixels = 12845056``). Pass your
    processor's values when neither can be read, so model-space boxes map back exactly.
    """

    factor: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 1280 * 28 * 28
    max_side: int | None = None

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image as the model sees it."""
        if self.max_side is not None:
            return longest_edge_resize(width, height, self.max_side, self.factor)
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h


def longest_edge_resize(width: int, height: int, max_side: int, patch: int) -> tuple[int, int]:
    """Pixtral's resize rule: the longer side at most ``max_side``, then each side rounded up
    to a multiple of ``patch``. An image already in that frame is left as it is."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image sides must be positive, got {width}x{height}")
    ratio = max(height, width) / max_side
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return math.ceil(max(width, 1) / patch) * patch, math.ceil(max(height, 1) / patch) * patch


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
) -> tuple[int, int]:
    """Qwen-VL's resize rule: sides multiples of ``factor``, pixel count within bounds.

    Returns ``(height, width)``, the order the Qwen processors use.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image sides must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"aspect ratio must be below 200, got {max(height, width) / min(height, width):.1f}"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
