"""The demo world: synthetic scenes where some queries need the zoom tool and the rest do not.

A 1024 px canvas is split into a 3x3 grid of named regions ("top-left", "centre", ...). The
target, an object of one of four colours, sits inside one region, and the question names
that region: "What is the color of the object in the top-left region?". Three other
regions hold a tiny dot each. Two kinds of scene:

- **large** targets (150-280 px) are plain to see at the models' 112/128 px input, so the
  small model can answer from the whole image (the queries SpecEyes should speculate on);
- **tiny** targets (12-16 px) shrink to a 1-2 px dot there, among three other dots that
  carry the other three colours; only the zoomed region (three times larger) shows the
  target alone (the queries that need the tool).

The large model behaves like DeepEyes: on every query it thinks, zooms on the region the
question names, thinks again over the crop and answers. So the agent path costs two
generations with reasoning, and skipping it pays, as in the paper. Naming the region makes
"where to zoom" a text mapping a tiny model learns on a CPU; every grid edge in the large
model's 112 px frame is a single token, so a box is four tokens (see the training notes in
the project's shared docs for the measurements behind each choice).

The small model can run the same loop once (depth-1 speculation): it sees the scene at 128 px,
so it writes its boxes in that frame (:data:`SMALL_FRAME`, edges one token each too), with a
one-sentence think before each action, so its loop stays cheap and its few box tokens are not
buried under think text (a longer think hid them for most of a training run: see the
training notes).

Everything a conversation contains is rendered exactly as the graph renders it at inference
(``tests/test_training.py`` runs the real graph with recording models and compares).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, ImageDraw

from speceyes_tools.geometry import limit_aspect
from speceyes_tools.images import ResizeSpec
from speceyes_tools.vision import resolve_box, zoom_array

from ..prompts import (
    JUDGE_SYSTEM_PROMPT,
    JUDGE_USER_SUFFIX,
    SPECULATOR_SYSTEM_PROMPT,
    SPECULATOR_USER_SUFFIX,
    Prompts,
)

__all__ = [
    "COLOURS",
    "DEMO_PROMPTS",
    "LARGE_FRAME",
    "LARGE_SPEC",
    "REGIONS",
    "SMALL_FRAME",
    "SMALL_SPEC",
    "Frame",
    "Scene",
    "after_tool",
    "conversations",
    "make_scene",
    "question_for",
    "region_box",
    "tool_call_text",
    "tool_crop",
    "view",
    "zoomed_crop",
]

CANVAS = 1024
BACKGROUND = (242, 240, 235)
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}
REGIONS = (
    ("top-left", "top", "top-right"),
    ("left", "centre", "right"),
    ("bottom-left", "bottom", "bottom-right"),
)
LARGE_SPEC = ResizeSpec(factor=28, min_pixels=112 * 112, max_pixels=112 * 112)  # 4x4 merged tokens
SMALL_SPEC = ResizeSpec(factor=32, min_pixels=128 * 128, max_pixels=128 * 128)
# Grid edges in the large model's 112 px frame (the coordinates it writes; one token each),
# and the same edges in original pixels, as the zoom tool maps them.
MODEL_EDGES = (0, 37, 75, 112)
EDGES = tuple(round(e * CANVAS / 112) for e in MODEL_EDGES)  # (0, 338, 686, 1024)
# The same grid in the small model's 128 px frame (original pixels (0, 344, 680, 1024): the
# region is 6 px narrower per side than EDGES, still well outside the MARGIN objects keep).
SMALL_MODEL_EDGES = (0, 43, 85, 128)
COORDINATE_TOKENS = tuple(str(e) for e in MODEL_EDGES + SMALL_MODEL_EDGES if e >= 10)
# Two-word region names are single tokens too (with their leading space, as they always stand
# after "the"): split as "top" + "-left", the tiny agent never learned to copy "-left" rather
# than "-right" from the question (measured: every top-left and bottom-left box on the right).
REGION_TOKENS = tuple(f" {name}" for row in REGIONS for name in row if "-" in name)
DEMO_TOKENS = COORDINATE_TOKENS + REGION_TOKENS
TINY_SIDE = (12, 16)
LARGE_SIDE = (150, 280)
MICRO_SIDE = (5, 8)  # micro targets: below what one zoom makes legible to the small model
MARGIN = 20  # keeps the object inside its region's crop whatever the rounding

# The judge and speculator prompts are the published ones; the agent's system prompt is a
# short version of DeepEyes' (its 290-token tool declaration would dominate CPU training).
DEMO_AGENT_SYSTEM = (
    "You are a helpful assistant. You can call image_zoom_in_tool to zoom in on a region: "
    '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2]}}</tool_call>. '
    "Give the final answer as <answer>...</answer>."
)
DEMO_PROMPTS = Prompts(
    judge_system=JUDGE_SYSTEM_PROMPT.rstrip("\n"),  # the checkpoints learned it without the newline
    question_style="compact",
    agent_system=DEMO_AGENT_SYSTEM,
    agent_suffix="\nThink, zoom in on the region, then answer.",
    tool_response_instruction="\nAnswer.",
)
# Reasoning the agent writes before each action: about 100 tokens before the zoom and 65
# before the answer (DeepEyes writes a few hundred per turn). The judge's cost is one short
# generation, so the agent's length is what the speculative path saves.
THINK_ZOOM = {
    True: (
        "<think>The question asks about the object in the {region} region. Looking at that part "
        "of the image, I can only see a small mark there, and other small marks elsewhere in the "
        "image. It is too small to make out its color at this resolution, and guessing could be "
        "wrong, so I will zoom in on the {region} region to see the object clearly before I "
        "answer.</think>\n"
    ),
    False: (
        "<think>The question asks about the object in the {region} region. Looking at that part "
        "of the image, I can see a large object there, and its shape is clear even at this "
        "resolution. To be sure of its color before I answer, I will zoom in on the {region} "
        "region and look at the object closely.</think>\n"
    ),
}
THINK_ANSWER = (
    "<think>The zoomed view of the {region} region shows the object clearly against the light "
    "background, with nothing else in that part of the image to confuse it with. "
    "Its color is {colour}, so that is my answer.</think>\n"
)
# The small agent's one-sentence thinks (depth-1 speculation): its loop is meant to be cheap,
# and a short think leaves the box tokens a visible share of the loss. One text for both
# sizes, with the region name right before the box (measured: with a think per size, only
# the large objects' boxes were learned).
SMALL_THINK_ZOOM = "<think>I will zoom in on the {region} region.</think>\n"
SMALL_THINK_ANSWER = "<think>The zoomed view shows the object clearly.</think>\n"


@dataclass(frozen=True)
class Frame:
    """The pixel frame a model writes its boxes in: the grid edges there, and the resize that
    defines that frame (the zoom tool maps the box back to original pixels through it)."""

    edges: tuple[int, ...]
    spec: ResizeSpec


LARGE_FRAME = Frame(MODEL_EDGES, LARGE_SPEC)
SMALL_FRAME = Frame(SMALL_MODEL_EDGES, SMALL_SPEC)


@dataclass
class Scene:
    image: np.ndarray  # 1024x1024x3 uint8
    colour: str
    tiny: bool
    box: tuple[int, int, int, int]  # the object, original pixels
    region: tuple[int, int]  # (row, col) in the 3x3 grid
    options: list[str]
    micro: bool = False  # a tiny scene whose target is MICRO_SIDE: one zoom leaves a 2-3 px dot

    @property
    def region_name(self) -> str:
        return REGIONS[self.region[0]][self.region[1]]

    @property
    def question(self) -> str:
        return question_for(self.region)


def question_for(region: tuple[int, int]) -> str:
    return f"What is the color of the object in the {REGIONS[region[0]][region[1]]} region?"


def make_scene(
    rng: np.random.Generator,
    tiny: bool,
    target_side: tuple[int, int] | None = None,
    micro: bool = False,
) -> Scene:
    """One scene; deterministic in the generator's state.

    Besides the target, three other regions hold a tiny dot each (distractors). In a tiny
    scene the four dots carry the four colours, so only the dot in the named region answers
    the question: seeing "a red dot somewhere" is not enough, and a model that cannot tell
    which dot lies where is at chance, while the zoomed region shows the target alone.

    ``target_side`` overrides the target's side range (TINY_SIDE / LARGE_SIDE by kind): the
    measurements try harder variants of a tiny scene with it (a 5-8 px target).
    ``micro``: a tiny scene with a :data:`MICRO_SIDE` target, the demo's hardest query: after
    the one zoom it is a 2-3 px dot that only the large model is trained to read.
    """
    if micro:
        tiny, target_side = True, MICRO_SIDE
    palette = list(COLOURS)
    colour = palette[int(rng.integers(0, len(palette)))]
    regions = [(r, c) for r in range(3) for c in range(3)]
    picked = rng.choice(len(regions), size=4, replace=False)
    region, others = regions[int(picked[0])], [regions[int(i)] for i in picked[1:]]
    if tiny:
        rest = [c for c in palette if c != colour]
        distractors = [rest[int(i)] for i in rng.permutation(3)]
    else:
        distractors = [palette[int(rng.integers(0, len(palette)))] for _ in others]
    img = Image.fromarray(_background())
    draw = ImageDraw.Draw(img)
    box = _place(rng, draw, region, target_side or (TINY_SIDE if tiny else LARGE_SIDE), colour)
    for where, c in zip(others, distractors, strict=True):
        _place(rng, draw, where, TINY_SIDE, c)
    options = [str(c) for c in rng.permutation(palette)]
    return Scene(np.asarray(img), colour, tiny, box, region, options, micro)


def _place(
    rng: np.random.Generator,
    draw: ImageDraw.ImageDraw,
    region: tuple[int, int],
    sides: tuple[int, int],
    colour: str,
) -> tuple[int, int, int, int]:
    """Draw a disc or square of a random size inside the region; returns its box."""
    row, col = region
    side = int(rng.integers(sides[0], sides[1] + 1))
    x = int(rng.integers(EDGES[col] + MARGIN, EDGES[col + 1] - MARGIN - side + 1))
    y = int(rng.integers(EDGES[row] + MARGIN, EDGES[row + 1] - MARGIN - side + 1))
    box = (x, y, x + side, y + side)
    (draw.ellipse if rng.integers(0, 2) else draw.rectangle)(box, fill=COLOURS[colour])
    return box


def _background() -> np.ndarray:
    """A light canvas whose red channel ramps left to right and blue top to bottom (+-10
    levels): a faint absolute-position cue in every image token."""
    ramp = np.linspace(-10, 10, CANVAS)
    bg = np.empty((CANVAS, CANVAS, 3), np.float32)
    bg[..., 0] = BACKGROUND[0] + ramp[None, :]
    bg[..., 1] = BACKGROUND[1]
    bg[..., 2] = BACKGROUND[2] + ramp[:, None]
    return bg.round().astype(np.uint8)


def view(image: np.ndarray, spec: ResizeSpec) -> np.ndarray:
    """The image as a model sees it (what ImageStore.model_view sends, before PNG)."""
    h, w = image.shape[:2]
    tw, th = spec.size(w, h)
    return cv2.resize(image, (tw, th), interpolation=cv2.INTER_AREA)


def region_box(region: tuple[int, int], frame: Frame = LARGE_FRAME) -> list[int]:
    """The region as a box in a model's frame (what its agent writes): by default the large
    model's 112 px frame."""
    r, c = region
    e = frame.edges
    return [e[c], e[r], e[c + 1], e[r + 1]]


def tool_call_text(region: tuple[int, int], frame: Frame = LARGE_FRAME) -> str:
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": region_box(region, frame)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def zoomed_crop(scene: Scene, frame: Frame = LARGE_FRAME) -> tuple[np.ndarray, str]:
    """The crop and tool text the real image_zoom_in_tool returns for the region's box, as
    the model of that frame writes it (the tool maps it back through the model's resize)."""
    return tool_crop(scene.image, region_box(scene.region, frame), frame)


def tool_crop(
    image: np.ndarray, bbox: list[int], frame: Frame = LARGE_FRAME
) -> tuple[np.ndarray, str]:
    """The crop and tool text the real image_zoom_in_tool (default settings) returns for any
    box a model writes in its frame (end-to-end measurements feed it the model's own box);
    raises the tool's ToolException for a box it rejects."""
    h, w = image.shape[:2]
    box = limit_aspect(resolve_box(bbox, image, "model", frame.spec), w, h, 100.0)
    crop = zoom_array(image, box, min_side=56, factor=28)
    h, w = crop.shape[:2]
    text = f"image_zoom_in_tool: region {box.as_list()} of the original image, shown at {w}x{h}."
    if box.notes:
        text += " Note: " + "; ".join(box.notes) + "."
    return crop, text


def zoom_reply(scene: Scene) -> str:
    return THINK_ZOOM[scene.tiny].format(region=scene.region_name) + tool_call_text(scene.region)


def answer_reply(scene: Scene) -> str:
    think = THINK_ANSWER.format(region=scene.region_name, colour=scene.colour)
    return f"{think}<answer>{scene.colour}</answer>"


def small_zoom_reply(scene: Scene) -> str:
    think = SMALL_THINK_ZOOM.format(region=scene.region_name)
    return think + tool_call_text(scene.region, SMALL_FRAME)


def small_answer_reply(scene: Scene) -> str:
    return f"{SMALL_THINK_ANSWER}<answer>{scene.colour}</answer>"


def _system(text: str) -> dict:
    return {"role": "system", "content": [{"type": "text", "text": text}]}


def _user(text: str, *images: np.ndarray) -> dict:
    return {
        "role": "user",
        "content": [*({"type": "image"} for _ in images), {"type": "text", "text": text}],
    }


def after_tool(agent: list[dict], call: str, tool_text: str) -> list[dict]:
    """The agent's first turn, its tool call, and the tool's response turn (text, crop) as
    the graph renders them for the next generation."""
    tool_turn = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<tool_response>"},
            {"type": "text", "text": tool_text},
            {"type": "image"},
            {"type": "text", "text": DEMO_PROMPTS.tool_response_instruction},
            {"type": "text", "text": "</tool_response>"},
        ],
    }
    return [*agent, {"role": "assistant", "content": [{"type": "text", "text": call}]}, tool_turn]


Conversation = tuple[list[dict], list[np.ndarray], str]  # chat messages, images, target reply


def conversations(scene: Scene) -> dict[str, Conversation]:
    """Every training conversation for one scene, keyed by task.

    ``draft`` (small model), ``judge``, ``zoom`` (think + tool call), ``after_zoom`` (think +
    answer over the crop), the small model's depth-1 loop in its 128 px frame
    (``small_zoom``, ``small_after_zoom``: the same turns, short thinks), and two short-prompt
    auxiliaries that teach a vision tower colour first: ``colour_crop`` and, for large
    objects, ``colour_full``.
    """
    q = DEMO_PROMPTS.question(scene.question, scene.options)
    full_large, full_small = view(scene.image, LARGE_SPEC), view(scene.image, SMALL_SPEC)
    agent = [_system(DEMO_AGENT_SYSTEM), _user(q + DEMO_PROMPTS.agent_suffix, full_large)]
    call = zoom_reply(scene)
    crop, text = zoomed_crop(scene)
    small_agent = [_system(DEMO_AGENT_SYSTEM), _user(q + DEMO_PROMPTS.agent_suffix, full_small)]
    small_call = small_zoom_reply(scene)
    small_crop, small_text = zoomed_crop(scene, SMALL_FRAME)
    out: dict[str, Conversation] = {
        "draft": (
            [_system(SPECULATOR_SYSTEM_PROMPT), _user(q + SPECULATOR_USER_SUFFIX, full_small)],
            [full_small],
            scene.colour,
        ),
        "judge": (
            [_system(DEMO_PROMPTS.judge_system), _user(q + JUDGE_USER_SUFFIX, full_large)],
            [full_large],
            "yes" if scene.tiny else "no",
        ),
        "zoom": (agent, [full_large], call),
        "after_zoom": (after_tool(agent, call, text), [full_large, crop], answer_reply(scene)),
        "small_zoom": (small_agent, [full_small], small_call),
        "small_after_zoom": (
            after_tool(small_agent, small_call, small_text),
            [full_small, small_crop],
            small_answer_reply(scene),
        ),
        "colour_crop": ([_user("What is the color of the object?", crop)], [crop], scene.colour),
    }
    if not scene.tiny:
        out["colour_full"] = (
            [_user("What is the color of the object?", full_large)],
            [full_large],
            scene.colour,
        )
    return out


def corpus() -> list[str]:
    """Text the demo tokenizer's BPE is trained on, so every prompt word is one token or two."""
    names = [name for row in REGIONS for name in row]
    lines = [
        DEMO_PROMPTS.judge_system,
        JUDGE_USER_SUFFIX,
        SPECULATOR_SYSTEM_PROMPT,
        DEMO_AGENT_SYSTEM,
        DEMO_PROMPTS.agent_suffix,
        DEMO_PROMPTS.tool_response_instruction,
        DEMO_PROMPTS.question(question_for((0, 0)), list(COLOURS)) + SPECULATOR_USER_SUFFIX,
        "What is the color of the object?",
    ]
    for r in range(3):
        for c in range(3):
            lines += [question_for((r, c)), tool_call_text((r, c))]
            x1, y1, x2, y2 = (EDGES[c], EDGES[r], EDGES[c + 1], EDGES[r + 1])
            lines.append(
                f"image_zoom_in_tool: region [{x1}, {y1}, {x2}, {y2}] of the original image, shown at 112x112."
            )
            lines.append(tool_call_text((r, c), SMALL_FRAME))
            x1, y1, x2, y2 = (round(v * CANVAS / 128) for v in region_box((r, c), SMALL_FRAME))
            lines.append(
                f"image_zoom_in_tool: region [{x1}, {y1}, {x2}, {y2}] of the original image, shown at 336x336."
            )
    for name in names:
        lines += [THINK_ZOOM[True].format(region=name), THINK_ZOOM[False].format(region=name)]
        lines += [THINK_ANSWER.format(region=name, colour=c) for c in COLOURS]
        lines.append(SMALL_THINK_ZOOM.format(region=name))
    lines += [SMALL_THINK_ANSWER + f"<answer>{c}</answer>" for c in COLOURS]
    return lines
