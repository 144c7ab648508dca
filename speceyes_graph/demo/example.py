"""The built-in offline example: the real graph, real tools, scripted models.

``speceyes example`` shows the workflow end to end on synthetic images without any weights
(the trained demo checkpoints are ``speceyes demo``'s): the judge, speculator and agent are
:class:`~speceyes_graph.models.ScriptedChatModel` instances with fixed rules (the models
are scripted; the graph, the gate, the tools and the coordinate mapping are real). The
scripted agent reads its answer from the pixels of the crop the zoom tool returns, so a
wrong box or a broken mapping gives a wrong answer.
"""

from __future__ import annotations

import base64
import io
import json
import re
import tempfile
from pathlib import Path
from typing import cast

import numpy as np
from langchain_core.messages import AIMessage, BaseMessage
from PIL import Image, ImageDraw

from ..graph.build import create_speceyes_graph
from ..models.scripted import ScriptedChatModel, fake_logprobs
from ..state import SpecEyesInput

__all__ = ["EXAMPLE_QUERIES", "make_example_models", "make_example_scenes", "run_example"]

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 200, 20),
}

# (id, question, options, object colour, object box in original pixels, judge says, draft separability)
EXAMPLE_QUERIES = [
    (
        "big-red",
        "What is the color of the large circle?",
        ["red", "blue", "green", "yellow"],
        "red",
        (500, 300, 1400, 1200),
        "no",
        9.0,
    ),
    (
        "big-green",
        "What is the color of the large square?",
        ["green", "red", "blue", "yellow"],
        "green",
        (900, 500, 1700, 1300),
        "no",
        8.0,
    ),
    (
        "tiny-blue",
        "What is the color of the tiny square near the corner?",
        ["blue", "red", "green", "yellow"],
        "blue",
        (2920, 2040, 2960, 2080),
        "yes",
        None,
    ),
    (
        "tiny-yellow",
        "What is the color of the small dot?",
        ["yellow", "red", "green", "blue"],
        "yellow",
        (150, 1800, 190, 1840),
        "no",
        3.0,
    ),
    (
        "tiny-red",
        "What is the color of the little mark on the right?",
        ["red", "green", "blue", "yellow"],
        "red",
        (3500, 900, 3536, 936),
        "yes",
        None,
    ),
    (
        "big-blue",
        "What is the color of the big shape?",
        ["blue", "green", "red", "yellow"],
        "blue",
        (1200, 400, 2400, 1600),
        "no",
        7.5,
    ),
]


def make_example_scenes(folder: Path) -> list[dict]:
    """Write one 3840x2160 PNG per query and return graph inputs with expected answers."""
    folder.mkdir(parents=True, exist_ok=True)
    inputs = []
    for qid, question, options, colour, box, _, _ in EXAMPLE_QUERIES:
        img = Image.new("RGB", (3840, 2160), (245, 245, 240))
        draw = ImageDraw.Draw(img)
        shape = draw.ellipse if "circle" in question or "dot" in question else draw.rectangle
        shape(box, fill=COLOURS[colour])
        path = folder / f"{qid}.png"
        img.save(path)
        inputs.append(
            {
                "query_id": qid,
                "question": question,
                "images": [str(path)],
                "options": options,
                "expected": "A",
            }
        )
    return inputs


def _question(messages: list[BaseMessage]) -> str:
    for m in messages:
        if m.type == "human":
            text = (
                "".join(b.get("text", "") for b in m.content if isinstance(b, dict))
                if isinstance(m.content, list)
                else m.content
            )
            if "Question:" in text:
                return text
    return ""


def _spec(messages: list[BaseMessage]):
    """The example query the prompt is about, or None for any other question."""
    text = _question(messages)
    for row in EXAMPLE_QUERIES:
        if row[1] in text:
            return row
    return None


def _last_image(messages: list[BaseMessage]) -> np.ndarray | None:
    for m in reversed(messages):
        if isinstance(m.content, list):
            for b in m.content:
                if isinstance(b, dict) and b.get("type") == "image":
                    return np.asarray(
                        Image.open(io.BytesIO(base64.b64decode(b["base64"]))).convert("RGB")
                    )
    return None


def _options(messages: list[BaseMessage]) -> list[str]:
    """Options listed in the prompt (``A. red``), in order."""
    return re.findall(r"^[A-H]\. (.+)$", _question(messages), re.M)


def _colourful_region(pixels: np.ndarray) -> list[int]:
    """A box around the saturated pixels (the whole image if there are none)."""
    flat = pixels.astype(int)
    mask = (flat.max(axis=2) - flat.min(axis=2)) > 60
    if not mask.any():
        return [0, 0, pixels.shape[1], pixels.shape[0]]
    ys, xs = np.nonzero(mask)
    return [int(xs.min()) - 10, int(ys.min()) - 10, int(xs.max()) + 10, int(ys.max()) + 10]


def _dominant_colour(pixels: np.ndarray) -> str:
    flat = pixels.reshape(-1, 3).astype(int)
    saturated = flat[(flat.max(axis=1) - flat.min(axis=1)) > 60]
    if len(saturated) == 0:
        return "unknown"
    mean = saturated.mean(axis=0)
    return min(COLOURS, key=lambda c: np.abs(np.array(COLOURS[c]) - mean).sum())


def make_example_models() -> tuple[ScriptedChatModel, ScriptedChatModel, ScriptedChatModel]:
    """(judge, speculator, agent) following the rules in :data:`EXAMPLE_QUERIES`."""

    def judge(messages):
        spec = _spec(messages)
        return spec[5] if spec else "yes"  # an unknown question: let the agent look closer

    def speculator(messages):
        spec = _spec(messages)
        sep = spec[6] if spec and spec[6] is not None else 3.0
        return AIMessage(content="A", response_metadata={"logprobs": fake_logprobs(["A"], [sep])})

    def agent(messages):
        spec = _spec(messages)
        options = spec[2] if spec else _options(messages)
        if messages[-1].type == "human" and "<tool_response>" in str(messages[-1].content):
            seen = _dominant_colour(_last_image(messages))
            letter = "ABCDEFGH"[options.index(seen)] if seen in options else seen
            return f"<think>The zoomed region shows a {seen} object.</think>\n<answer>{letter}</answer>"
        shown = _last_image(messages)  # the full image at the size the model sees it
        if shown is None:
            return "<think>There is no image to look at.</think>\n<answer>unknown</answer>"
        if spec:
            sx, sy = shown.shape[1] / 3840, shown.shape[0] / 2160
            box = spec[4]
            bbox = [
                round(box[0] * sx) - 10,
                round(box[1] * sy) - 10,
                round(box[2] * sx) + 10,
                round(box[3] * sy) + 10,
            ]
        else:  # any other question: look at the most colourful region
            bbox = _colourful_region(shown)
        call = json.dumps(
            {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": bbox, "label": "the object"}}
        )
        return f"<think>The object is small; zoom in.</think>\n<tool_call>\n{call}\n</tool_call>"

    return (
        ScriptedChatModel(respond=judge),
        ScriptedChatModel(respond=speculator),
        ScriptedChatModel(respond=agent),
    )


def run_example(folder: Path | None = None, print_fn=print) -> list[dict]:
    """Run the graph on the example queries (batched) and print one line per query."""
    folder = folder or Path(tempfile.mkdtemp(prefix="speceyes-example-"))
    inputs = make_example_scenes(folder)
    judge, speculator, agent = make_example_models()
    graph = create_speceyes_graph(judge=judge, speculator=speculator, agent=agent).compile()
    # a scene's keys but "expected" are graph inputs (make_example_scenes writes them)
    results = graph.batch(
        [cast(SpecEyesInput, {k: v for k, v in q.items() if k != "expected"}) for q in inputs]
    )
    print_fn("speceyes example: real graph, gate and zoom tool; SCRIPTED models (no weights)\n")
    print_fn(f"{'query':<12} {'route':<17} {'answer':<7} {'ok':<4} {'draft score':<12} agent steps")
    for q, r in zip(inputs, results):
        draft = r.get("draft") or {}
        score = f"{draft['score']:.4f}" if draft.get("score") is not None else "-"
        ok = "yes" if r.get("answer") == q["expected"] else "NO"
        print_fn(
            f"{q['query_id']:<12} {r.get('route') or 'error':<17} {str(r.get('answer')):<7} {ok:<4} {score:<12} {len(r.get('agent_steps') or [])}"
        )
    return results
