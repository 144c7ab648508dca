"""A synthetic high-resolution suite in V* Bench's on-disk format, generated from a seed.

Scenes of 1-8K pixels with coloured shapes and printed signs at many scales, and the four
kinds of question the real benchmarks ask: an object's colour (V* direct attributes),
left/right of two objects (V* relative position), existence with adversarial negatives
(POPE), and reading a sign (HR-Bench-style text). ``zoom_fraction`` is the difficulty
knob: the share of queries whose target is small enough (1-2% of the short side) that a
model looking at the ~1 MP resized image needs to zoom.

Layout: ``DIR/<kind>/<id>.jpg`` + ``<id>.json`` with ``question`` and ``options`` (the
correct option first, as in V*), plus ground truth: ``bbox`` of the object asked about
(``[x1, y1, x2, y2]`` in original pixels; for relative position the first object),
``needs_zoom``, ``answer_text`` and ``kind``. The V* loader reads it unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["COLOURS", "KINDS", "SHAPES", "generate_suite", "make_query"]

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 170),
    "orange": (245, 130, 30),
}
SHAPES = ("circle", "square", "triangle")
WORDS = (
    "OPEN",
    "EXIT",
    "CAFE",
    "BANK",
    "PARK",
    "SALE",
    "HOTEL",
    "TAXI",
    "STOP",
    "MARKET",
    "LIBRARY",
    "MUSEUM",
)
KINDS = ("direct_attributes", "relative_position", "existence", "text_reading")
SIZES = ((1280, 960), (1920, 1080), (2560, 1440), (3840, 2160), (5120, 2880), (7680, 4320))
BACKGROUND = (242, 240, 235)


@dataclass
class _Obj:
    shape: str
    colour: str
    box: tuple[int, int, int, int]


def _draw(draw: ImageDraw.ImageDraw, obj: _Obj) -> None:
    x1, y1, x2, y2 = obj.box
    fill = COLOURS[obj.colour]
    if obj.shape == "circle":
        draw.ellipse(obj.box, fill=fill)
    elif obj.shape == "square":
        draw.rectangle(obj.box, fill=fill)
    else:
        draw.polygon([((x1 + x2) / 2, y1), (x2, y2), (x1, y2)], fill=fill)


def _place(
    rng: np.random.Generator, w: int, h: int, side: int, taken: list[tuple]
) -> tuple[int, int, int, int]:
    """A free square box of the given side (no overlap with ``taken``, with a margin)."""
    for _ in range(200):
        x = int(rng.integers(0, w - side))
        y = int(rng.integers(0, h - side))
        box = (x, y, x + side, y + side)
        margin = side // 2
        if all(
            box[2] + margin < t[0]
            or t[2] + margin < box[0]
            or box[3] + margin < t[1]
            or t[3] + margin < box[1]
            for t in taken
        ):
            return box
    raise RuntimeError("could not place an object without overlap")


def _side(rng: np.random.Generator, w: int, h: int, small: bool) -> int:
    short = min(w, h)
    frac = rng.uniform(0.012, 0.022) if small else rng.uniform(0.12, 0.22)
    return max(16, int(short * frac))


def _shuffle_others(rng, pool, exclude, n):
    others = [p for p in pool if p not in exclude]
    return [str(x) for x in rng.permutation(others)[:n]]


def make_query(kind: str, seed: int, small: bool, max_side: int = 7680) -> tuple[Image.Image, dict]:
    """One scene and its question (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    sizes = [s for s in SIZES if s[0] <= max_side] or [SIZES[0]]
    w, h = sizes[int(rng.integers(0, len(sizes)))]
    img = Image.new("RGB", (w, h), BACKGROUND)
    draw = ImageDraw.Draw(img)
    taken: list[tuple] = []
    objects: list[_Obj] = []

    def add(shape, colour, small_obj):
        box = _place(rng, w, h, _side(rng, w, h, small_obj), taken)
        taken.append(box)
        obj = _Obj(shape, colour, box)
        objects.append(obj)
        _draw(draw, obj)
        return obj

    colours = list(COLOURS)
    shape_order = [str(s) for s in rng.permutation(SHAPES)]
    meta: dict = {"kind": kind, "needs_zoom": bool(small), "image_size": [w, h]}
    if kind == "direct_attributes":
        target = add(shape_order[0], colours[int(rng.integers(0, 6))], small)
        for shape in shape_order[1:]:  # distractors of other shapes, always large
            add(shape, colours[int(rng.integers(0, 6))], False)
        question = f"What is the color of the {target.shape}?"
        options = [target.colour, *_shuffle_others(rng, colours, {target.colour}, 3)]
        meta.update(bbox=list(target.box), answer_text=target.colour)
    elif kind == "relative_position":
        a = add(shape_order[0], colours[int(rng.integers(0, 6))], small)
        b = add(shape_order[1], colours[int(rng.integers(0, 6))], small)
        if abs((a.box[0] + a.box[2]) - (b.box[0] + b.box[2])) < (
            a.box[2] - a.box[0]
        ):  # too close to call
            return make_query(kind, seed + 7919, small, max_side)
        side = "left" if a.box[0] + a.box[2] < b.box[0] + b.box[2] else "right"
        question = (
            f"Is the {a.colour} {a.shape} on the left or right side of the {b.colour} {b.shape}?"
        )
        options = [side, "right" if side == "left" else "left"]
        meta.update(bbox=list(a.box), bbox_other=list(b.box), answer_text=side)
    elif kind == "existence":
        present = bool(rng.integers(0, 2))
        target = add(shape_order[0], colours[int(rng.integers(0, 6))], small)
        add(shape_order[1], colours[int(rng.integers(0, 6))], False)
        if present:
            shape, colour = target.shape, target.colour
            meta.update(bbox=list(target.box))
        else:  # adversarial: the shape exists in another colour, the colour on another shape
            shape = target.shape
            other = objects[1].colour
            colour = (
                other
                if other != target.colour
                else _shuffle_others(rng, colours, {target.colour}, 1)[0]
            )
            meta.update(bbox=None)
        article = "an" if colour[0] in "aeiou" else "a"
        question = f"Is there {article} {colour} {shape} in the image?"
        answer = "yes" if present else "no"
        options = [answer, "no" if present else "yes"]
        meta.update(answer_text=answer)
    elif kind == "text_reading":
        word = WORDS[int(rng.integers(0, len(WORDS)))]
        px = max(
            10, int(min(w, h) * (rng.uniform(0.008, 0.012) if small else rng.uniform(0.05, 0.08)))
        )
        font = ImageFont.load_default(size=px)
        tw = int(font.getlength(word)) + px
        box = _place(rng, w, h, max(tw, 2 * px), taken)
        x1, y1 = box[0], box[1]
        sign = (x1, y1, x1 + tw, y1 + 2 * px)
        draw.rectangle(sign, fill=(255, 255, 255), outline=(30, 30, 30), width=max(1, px // 8))
        draw.text((x1 + px // 2, y1 + px // 2), word, fill=(20, 20, 20), font=font)
        taken.append(sign)
        add(shape_order[0], colours[int(rng.integers(0, 6))], False)
        question = "What is written on the sign?"
        options = [word, *_shuffle_others(rng, WORDS, {word}, 3)]
        meta.update(bbox=list(sign), answer_text=word)
    else:
        raise ValueError(f"unknown kind {kind!r}; use one of {KINDS}")
    return img, {"question": question, "options": options, **meta}


def generate_suite(
    out_dir: str | Path,
    n: int = 200,
    *,
    seed: int = 0,
    zoom_fraction: float = 0.5,
    max_side: int = 7680,
    kinds: tuple[str, ...] = KINDS,
    quality: int = 92,
    progress: bool = True,
) -> Path:
    """Write ``n`` queries (spread evenly over ``kinds``) in V* layout; deterministic in ``seed``."""
    out = Path(out_dir)
    rng = np.random.default_rng(seed)
    n_small = int(round(n * zoom_fraction))
    small_flags = np.array([True] * n_small + [False] * (n - n_small))
    rng.shuffle(small_flags)
    items = range(n)
    if progress:
        from ..progress import progress_bar

        items = progress_bar(items, desc="synth", unit="query")
    for i in items:
        kind = kinds[i % len(kinds)]
        img, meta = make_query(kind, seed * 1_000_003 + i, bool(small_flags[i]), max_side)
        folder = out / kind
        folder.mkdir(parents=True, exist_ok=True)
        qid = f"syn_{i:05d}"
        img.save(folder / f"{qid}.jpg", quality=quality)
        (folder / f"{qid}.json").write_text(json.dumps(meta))
    (out / "suite.json").write_text(
        json.dumps(
            {
                "n": n,
                "seed": seed,
                "zoom_fraction": zoom_fraction,
                "max_side": max_side,
                "kinds": list(kinds),
            }
        )
    )
    return out
