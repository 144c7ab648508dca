"""Boxes written by a model: parse defensively, map to original pixels, clamp.

A model's box is untrusted text. Everything that can be repaired is repaired and noted
(reversed corners, out-of-bounds, tiny boxes); everything that cannot (NaN, wrong arity,
non-numbers, zero area) raises :class:`BoxError`, whose message is written for the model
to read and correct itself, since the agent loop returns it as the tool's answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .images import ResizeSpec

__all__ = ["BoxError", "Coordinates", "PixelBox", "parse_box", "to_original", "clamp_box"]

Coordinates = Literal["model", "original", "normalized", "thousand"]
"""Which frame a model's box is in.

- ``model``: pixels of the image as the model saw it, after the processor's smart resize
  (DeepEyes, Qwen2.5-VL grounding);
- ``original``: pixels of the original file;
- ``normalized``: fractions 0-1 of width and height;
- ``thousand``: 0-1000 relative coordinates (Qwen3-VL grounding).
"""

MIN_SIDE = 28


class BoxError(ValueError):
    """A box the tool cannot use; the message is meant for the model."""


@dataclass(frozen=True)
class PixelBox:
    """An integer box in original-image pixels, half-open: ``[x1, x2) x [y1, y2)``."""

    x1: int
    y1: int
    x2: int
    y2: int
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def width(self) -> int:
        return self.x2 - self.x1

    @property
    def height(self) -> int:
        return self.y2 - self.y1

    def as_list(self) -> list[int]:
        return [self.x1, self.y1, self.x2, self.y2]


def parse_box(raw: object) -> tuple[float, float, float, float]:
    """Four finite numbers ``[x1, y1, x2, y2]`` or a :class:`BoxError` saying what is wrong."""
    if isinstance(raw, str):
        raise BoxError(f"bbox must be a list of 4 numbers [x1, y1, x2, y2], got the string {raw!r}")
    if not isinstance(raw, Sequence) or isinstance(raw, bytes):
        raise BoxError(f"bbox must be a list of 4 numbers [x1, y1, x2, y2], got {raw!r}")
    if len(raw) != 4:
        raise BoxError(
            f"bbox must have exactly 4 numbers [x1, y1, x2, y2], got {len(raw)}: {list(raw)!r}"
        )
    values = []
    for v in raw:
        if isinstance(v, bool):
            raise BoxError(f"bbox values must be numbers, got {v!r}")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise BoxError(f"bbox values must be numbers, got {v!r}") from None
        if not math.isfinite(f):
            raise BoxError(f"bbox values must be finite numbers, got {v!r}")
        values.append(f)
    return values[0], values[1], values[2], values[3]


def to_original(
    box: tuple[float, float, float, float],
    original_size: tuple[int, int],
    coordinates: Coordinates = "model",
    resize: ResizeSpec | None = None,
) -> tuple[float, float, float, float]:
    """Map a box from the model's frame to original pixels (no clamping yet)."""
    width, height = original_size
    x1, y1, x2, y2 = box
    if coordinates == "original":
        return box
    if coordinates == "model":
        seen_w, seen_h = (resize or ResizeSpec()).size(width, height)
        sx, sy = width / seen_w, height / seen_h
    elif coordinates == "normalized":
        sx, sy = width, height
    elif coordinates == "thousand":
        sx, sy = width / 1000.0, height / 1000.0
    else:
        raise ValueError(f"unknown coordinates convention {coordinates!r}")
    return x1 * sx, y1 * sy, x2 * sx, y2 * sy


def clamp_box(
    box: tuple[float, float, float, float],
    width: int,
    height: int,
    min_side: int = MIN_SIDE,
) -> PixelBox:
    """Swap reversed corners, clamp to the image, enlarge tiny boxes around their centre."""
    notes: list[str] = []
    x1, y1, x2, y2 = box
    if x1 > x2:
        x1, x2 = x2, x1
        notes.append("swapped x1/x2")
    if y1 > y2:
        y1, y2 = y2, y1
        notes.append("swapped y1/y2")
    cx1, cy1 = min(max(x1, 0.0), width), min(max(y1, 0.0), height)
    cx2, cy2 = min(max(x2, 0.0), width), min(max(y2, 0.0), height)
    if (cx1, cy1, cx2, cy2) != (x1, y1, x2, y2):
        notes.append("clamped to the image")
    if cx2 - cx1 <= 0 or cy2 - cy1 <= 0:
        raise BoxError(
            f"bbox {[round(v, 1) for v in box]} has zero area inside the {width}x{height} image; "
            "give [x1, y1, x2, y2] with x1 < x2 and y1 < y2 inside the image"
        )
    ix1, iy1 = math.floor(cx1), math.floor(cy1)
    ix2, iy2 = math.ceil(cx2), math.ceil(cy2)
    ix1, ix2, grew_x = _grow(ix1, ix2, min(min_side, width), width)
    iy1, iy2, grew_y = _grow(iy1, iy2, min(min_side, height), height)
    if grew_x or grew_y:
        notes.append(f"enlarged to the minimum side of {min_side}px")
    return PixelBox(ix1, iy1, ix2, iy2, tuple(notes))


def _grow(lo: int, hi: int, side: int, limit: int) -> tuple[int, int, bool]:
    """Widen ``[lo, hi)`` to ``side`` around its centre, shifted to stay inside ``[0, limit)``."""
    if hi - lo >= side:
        return lo, hi, False
    centre = (lo + hi) / 2
    lo = int(round(centre - side / 2))
    lo = min(max(lo, 0), limit - side)
    return lo, lo + side, True


def limit_aspect(box: PixelBox, width: int, height: int, max_aspect: float) -> PixelBox:
    """Widen the short side of a very thin box until its aspect ratio is at most ``max_aspect``."""
    w, h = box.width, box.height
    if max(w, h) / min(w, h) <= max_aspect:
        return box
    x1, x2, y1, y2 = box.x1, box.x2, box.y1, box.y2
    if w < h:
        x1, x2, _ = _grow(x1, x2, min(math.ceil(h / max_aspect), width), width)
    else:
        y1, y2, _ = _grow(y1, y2, min(math.ceil(w / max_aspect), height), height)
    return PixelBox(x1, y1, x2, y2, box.notes + (f"widened to aspect ratio <= {max_aspect:g}",))
