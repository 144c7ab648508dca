"""Training the embedded demo checkpoints on a simplified synthetic world (CPU by default).

The world (:func:`make_scene`): a 1024x1024 canvas with one object of one of four colours.
Large objects (160-320 px) are plain to see at the models' 112-128 px input; small ones
(10-16 px, inside one cell of a 4x4 grid) are a diluted pixel there, and only the zoomed
cell shows their colour. The question is always "What is the color of the object?" with
the four colours as options, answered with the colour word.

Two real architectures, trained from scratch with the same tokenizer/processor path as real
checkpoints and saved with ``save_pretrained``:

- **small** (Qwen3-VL): answers from the downscaled full image (the speculator);
- **large** (Qwen2.5-VL): answers the published judge prompt (yes = tools help = small
  object), answers large objects directly or emits a DeepEyes ``image_zoom_in_tool`` call
  with the box of the object's cell, and answers after seeing the crop as a
  ``<tool_response>`` user turn.

Lessons from earlier attempts, applied here (see the project's training notes): image
normalisation centred on the light background (mean 0.9, std 0.3), so the vision tower's
gradients do not collapse; colour words instead of option letters; every task present from
the first step so the easy ones carry the vision tower.

Conversations are rendered exactly as the graph renders them at inference
(``tests/test_training.py`` checks the two paths give identical prompts).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageDraw

from speceyes_tools.images import ResizeSpec
from speceyes_tools.vision import zoom_array

from .prompts import (
    JUDGE_SYSTEM_PROMPT,
    JUDGE_USER_SUFFIX,
    SPECULATOR_SYSTEM_PROMPT,
    SPECULATOR_USER_SUFFIX,
    Prompts,
)

__all__ = [
    "DEMO_PROMPTS",
    "LARGE_SPEC",
    "SMALL_SPEC",
    "Scene",
    "build_demo_processor",
    "make_scene",
    "train_demo",
]

CANVAS, GRID = 1024, 4
CELL = CANVAS // GRID
BACKGROUND = (242, 240, 235)
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}
QUESTION = "What is the color of the object?"
LARGE_SPEC = ResizeSpec(factor=28, min_pixels=112 * 112, max_pixels=112 * 112)  # 4x4 merged tokens
SMALL_SPEC = ResizeSpec(factor=32, min_pixels=128 * 128, max_pixels=128 * 128)

# The judge and speculator prompts are the published ones; the agent's are short versions
# of DeepEyes' (its 290-token tool declaration would dominate CPU training and inference).
DEMO_AGENT_SYSTEM = (
    "You are a helpful assistant. You can call image_zoom_in_tool to zoom in on a region: "
    '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2]}}</tool_call>. '
    "Give the final answer as <answer>...</answer>."
)
DEMO_PROMPTS = Prompts(
    judge_system=JUDGE_SYSTEM_PROMPT.rstrip("\n"),  # the checkpoints learned it without the newline
    question_style="compact",
    agent_system=DEMO_AGENT_SYSTEM,
    agent_suffix="\nZoom in if needed, then answer.",
    tool_response_instruction="\nAnswer.",
)
THINK_LARGE = "<think>The object is large enough to see.</think>\n"
THINK_SMALL = "<think>The object is too small to see, zoom in.</think>\n"
THINK_CROP = "<think>The zoomed region shows the object.</think>\n"


@dataclass
class Scene:
    image: np.ndarray  # 1024x1024x3 uint8
    colour: str
    small: bool
    box: tuple[int, int, int, int]  # the object, original pixels
    cell: tuple[int, int]  # (row, col) of the object's centre
    options: list[str]


def make_scene(rng: np.random.Generator, small: bool) -> Scene:
    """One scene; deterministic in the generator's state."""
    colour = list(COLOURS)[int(rng.integers(0, 4))]
    img = Image.fromarray(_background())
    draw = ImageDraw.Draw(img)
    if small:
        side = int(rng.integers(10, 17))
        row, col = int(rng.integers(0, GRID)), int(rng.integers(0, GRID))
        x = col * CELL + int(rng.integers(24, CELL - 24 - side))
        y = row * CELL + int(rng.integers(24, CELL - 24 - side))
    else:
        side = int(rng.integers(160, 321))
        x, y = int(rng.integers(0, CANVAS - side)), int(rng.integers(0, CANVAS - side))
        row, col = min(GRID - 1, (y + side // 2) // CELL), min(GRID - 1, (x + side // 2) // CELL)
    box = (x, y, x + side, y + side)
    (draw.ellipse if rng.integers(0, 2) else draw.rectangle)(box, fill=COLOURS[colour])
    options = [str(c) for c in rng.permutation(list(COLOURS))]
    return Scene(np.asarray(img), colour, small, box, (row, col), options)


def _background() -> np.ndarray:
    """A light canvas whose red channel ramps left to right and blue top to bottom (+-10
    levels): a faint absolute-position cue in every image token, which makes "which cell
    holds the dot" learnable for a tiny model whose vision tower only has relative (rope)
    positions."""
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


def cell_bbox(cell: tuple[int, int]) -> list[int]:
    """The object's cell as a box in the large model's 112 px frame."""
    side = 112 // GRID
    r, c = cell
    return [c * side, r * side, (c + 1) * side, (r + 1) * side]


def tool_call_text(cell: tuple[int, int]) -> str:
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": cell_bbox(cell)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def zoomed_crop(scene: Scene) -> tuple[np.ndarray, str]:
    """The crop and tool text the real image_zoom_in_tool returns for the cell box."""
    from speceyes_tools.vision import resolve_box

    box = resolve_box(cell_bbox(scene.cell), scene.image, "model", LARGE_SPEC)
    crop = zoom_array(scene.image, box, min_side=56, factor=28)
    h, w = crop.shape[:2]
    text = f"image_zoom_in_tool: region {box.as_list()} of the original image, shown at {w}x{h}."
    if box.notes:
        text += " Note: " + "; ".join(box.notes) + "."
    return crop, text


def _user(text: str, *images: np.ndarray) -> dict:
    return {
        "role": "user",
        "content": [*({"type": "image"} for _ in images), {"type": "text", "text": text}],
    }


def conversations(scene: Scene) -> dict[str, tuple[list[dict], list[np.ndarray], str]]:
    """Every training conversation for one scene: (chat messages, images, target reply)."""
    q = DEMO_PROMPTS.question(QUESTION, scene.options)
    full_large, full_small = view(scene.image, LARGE_SPEC), view(scene.image, SMALL_SPEC)
    out = {
        "draft": (
            [
                {"role": "system", "content": [{"type": "text", "text": SPECULATOR_SYSTEM_PROMPT}]},
                _user(q + SPECULATOR_USER_SUFFIX, full_small),
            ],
            [full_small],
            scene.colour,
        ),
        "judge": (
            [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": DEMO_PROMPTS.judge_system}],
                },
                _user(q + JUDGE_USER_SUFFIX, full_large),
            ],
            [full_large],
            "yes" if scene.small else "no",
        ),
    }
    agent = [
        {"role": "system", "content": [{"type": "text", "text": DEMO_AGENT_SYSTEM}]},
        _user(q + DEMO_PROMPTS.agent_suffix, full_large),
    ]
    if not scene.small:
        out["answer"] = (agent, [full_large], f"{THINK_LARGE}<answer>{scene.colour}</answer>")
    else:
        call = f"{THINK_SMALL}{tool_call_text(scene.cell)}"
        out["zoom"] = (agent, [full_large], call)
        crop, text = zoomed_crop(scene)
        turn = {
            "role": "user",
            "content": [
                {"type": "text", "text": "<tool_response>"},
                {"type": "text", "text": text},
                {"type": "image"},
                {"type": "text", "text": DEMO_PROMPTS.tool_response_instruction},
                {"type": "text", "text": "</tool_response>"},
            ],
        }
        out["after_zoom"] = (
            [*agent, {"role": "assistant", "content": [{"type": "text", "text": call}]}, turn],
            [full_large, crop],
            f"{THINK_CROP}<answer>{scene.colour}</answer>",
        )
        # auxiliary: the colour straight from the crop (teaches the vision tower colour early)
        out["colour_crop"] = ([_user(QUESTION, crop)], [crop], scene.colour)
        # auxiliary: the cell's box alone, short prompt (localisation without the format)
        out["locate"] = (
            [_user("Where is the object? Give its box.", full_large)],
            [full_large],
            json.dumps(cell_bbox(scene.cell)),
        )
    if not scene.small:  # auxiliary: the colour of a large object, short prompt
        out["colour_full"] = ([_user(QUESTION, full_large)], [full_large], scene.colour)
    return out


# --- models -----------------------------------------------------------------------------------------


def _extra_corpus() -> list[str]:
    lines = [
        DEMO_PROMPTS.judge_system,
        JUDGE_USER_SUFFIX,
        SPECULATOR_SYSTEM_PROMPT,
        DEMO_AGENT_SYSTEM,
        DEMO_PROMPTS.agent_suffix,
        DEMO_PROMPTS.tool_response_instruction,
        THINK_LARGE,
        THINK_SMALL,
        THINK_CROP,
        DEMO_PROMPTS.question(QUESTION, list(COLOURS)) + SPECULATOR_USER_SUFFIX,
    ]
    lines += [tool_call_text((r, c)) for r in range(GRID) for c in range(GRID)]
    lines += [
        f"image_zoom_in_tool: region [{c * CELL}, {r * CELL}, {(c + 1) * CELL}, {(r + 1) * CELL}] of the original image, shown at 252x252."
        for r in range(GRID)
        for c in range(GRID)
    ]
    return lines


def build_demo_processor(kind: str) -> Any:
    """Tokenizer + real processor classes, normalised around the light background."""
    from .tiny import _processor, build_tokenizer

    tok = build_tokenizer(1024, _extra_corpus())
    spec = LARGE_SPEC if kind == "large" else SMALL_SPEC
    proc = _processor(kind, tok, spec.min_pixels, spec.max_pixels)
    proc.image_processor.image_mean = [0.9, 0.9, 0.9]
    proc.image_processor.image_std = [0.3, 0.3, 0.3]
    return proc


# The demo architectures (from the project's training notes): a 2.75M-parameter Qwen2.5-VL and a
# 1.4M-parameter Qwen3-VL; head_dim 32, so mrope_section sums to 16.
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
DEMO_ARCH = {
    "large": (
        dict(
            hidden_size=192,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters=_ROPE,
        ),
        dict(
            depth=3,
            hidden_size=128,
            intermediate_size=256,
            num_heads=4,
            out_hidden_size=192,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[2],
            tokens_per_second=2,
        ),
    ),
    "small": (
        dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters={**_ROPE, "mrope_interleaved": True},
        ),
        dict(
            depth=2,
            hidden_size=96,
            intermediate_size=192,
            num_heads=4,
            out_hidden_size=128,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
    ),
}


def build_demo_model(kind: str, tok: Any, seed: int) -> Any:
    import torch

    from .tiny import build_qwen_vl

    torch.manual_seed(seed)
    return build_qwen_vl(kind, tok, *DEMO_ARCH[kind])


# --- data -----------------------------------------------------------------------------------------


TASKS = {
    "small": ("draft",),
    "large": ("judge", "answer", "zoom", "after_zoom", "colour_full", "colour_crop"),
}
EVAL_TASKS = {"small": ("draft",), "large": ("judge", "answer", "zoom", "after_zoom")}


def encode(processor: Any, messages: list[dict], images: list[np.ndarray], reply: str) -> dict:
    """Prompt through the processor (as at inference), reply tokens appended as labels."""
    import torch

    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[prompt], images=images, return_tensors="pt")
    tok = processor.tokenizer
    reply_ids = tok.encode(reply, add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]
    ids = inputs["input_ids"][0].tolist() + reply_ids
    sample = {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor([-100] * inputs["input_ids"].shape[1] + reply_ids),
        "pixel_values": inputs["pixel_values"],
        "image_grid_thw": inputs["image_grid_thw"],
    }
    if "mm_token_type_ids" in inputs:
        sample["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"][0], torch.zeros(len(reply_ids), dtype=torch.long)]
        )
    return sample


def collate(samples: list[dict], pad_id: int) -> dict:
    import torch

    n = max(len(s["input_ids"]) for s in samples)
    batch = {
        "input_ids": torch.full((len(samples), n), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(samples), n), dtype=torch.long),
        "labels": torch.full((len(samples), n), -100, dtype=torch.long),
    }
    if "mm_token_type_ids" in samples[0]:
        batch["mm_token_type_ids"] = torch.zeros((len(samples), n), dtype=torch.long)
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        batch["input_ids"][i, :k] = s["input_ids"]
        batch["attention_mask"][i, :k] = 1
        batch["labels"][i, :k] = s["labels"]
        if "mm_token_type_ids" in batch:
            batch["mm_token_type_ids"][i, :k] = s["mm_token_type_ids"]
    batch["pixel_values"] = torch.cat([s["pixel_values"] for s in samples])
    batch["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in samples])
    return batch


VISION_FIRST = {
    "large": ("colour_full", "colour_crop")
}  # stage 1: the vision tower learns colour alone


def sample_stream(
    kind: str, processor: Any, seed: int, tasks: tuple[str, ...] | None = None
) -> Iterator[tuple[str, dict]]:
    """Endless (task, encoded sample) pairs; half the scenes small."""
    rng = np.random.default_rng(seed)
    tasks = tasks or TASKS[kind]
    while True:
        scene = make_scene(rng, small=bool(rng.integers(0, 2)))
        convs = conversations(scene)
        for task in tasks:
            if task in convs:
                yield task, encode(processor, *convs[task])


# --- evaluation (teacher-free, greedy, on held-out scenes) --------------------------------------------


def evaluate(
    kind: str, model: Any, processor: Any, n: int = 64, seed: int = 10_000
) -> dict[str, float]:
    """Greedy accuracy per task on held-out scenes (separate seed range from training)."""
    import torch

    from .protocol import extract_answer, parse_deepeyes

    rng = np.random.default_rng(seed)
    scenes = [make_scene(rng, small=i % 2 == 1) for i in range(n)]
    tok = processor.tokenizer
    tok.padding_side = "left"
    hits: dict[str, list[bool]] = {}
    for task in EVAL_TASKS[kind]:
        items = [(s, conversations(s).get(task)) for s in scenes]
        items = [(s, c) for s, c in items if c is not None]
        for start in range(0, len(items), 16):
            chunk = items[start : start + 16]
            prompts = [
                processor.apply_chat_template(c[0], add_generation_prompt=True, tokenize=False)
                for _, c in chunk
            ]
            inputs = processor(
                text=prompts,
                images=[im for _, c in chunk for im in c[1]],
                return_tensors="pt",
                padding=True,
            )
            with torch.inference_mode():
                out = model.generate(**inputs, max_new_tokens=96, do_sample=False)
            texts = tok.batch_decode(
                out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
            )
            for (scene, _), text in zip(chunk, texts, strict=True):
                if task == "draft":
                    key = "draft_small" if scene.small else "draft_large"
                    ok = text.strip() == scene.colour
                elif task == "judge":
                    key, ok = (
                        "judge",
                        text.strip().lower().startswith("yes" if scene.small else "no"),
                    )
                elif task == "zoom":
                    calls = parse_deepeyes(text, {"image_zoom_in_tool"}).tool_calls
                    key, ok = (
                        "zoom_box",
                        bool(calls) and calls[0]["args"].get("bbox_2d") == cell_bbox(scene.cell),
                    )
                else:
                    key, ok = task, extract_answer(text) == scene.colour
                hits.setdefault(key, []).append(ok)
    return {k: float(np.mean(v)) for k, v in hits.items()}


# --- training loop ----------------------------------------------------------------------------------


def train_demo(
    out_dir: str | Path,
    kind: str,
    *,
    minutes: float = 20.0,
    seed: int = 0,
    batch_size: int = 16,
    lr: float = 1.5e-3,
    eval_every: int = 200,
    threads: int | None = None,
    vision_steps: int = 400,
    tasks: tuple[str, ...] | None = None,
    max_steps: int | None = None,
    log=print,
) -> Path:
    """Train one demo checkpoint for a wall-clock budget; saves the best evaluation.

    The large model first spends ``vision_steps`` steps on colour alone (full image and
    crop, short prompts): measured here, the full mix left its colour accuracy at chance
    after 500 steps, while colour alone starts rising after ~80 steps.
    """
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    out = Path(out_dir) / kind
    processor = build_demo_processor(kind)
    model = build_demo_model(kind, processor.tokenizer, seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"[{kind}] {type(model).__name__}: {n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} threads"
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    stream = sample_stream(kind, processor, seed, tasks)
    first = (
        sample_stream(kind, processor, seed + 1, VISION_FIRST[kind])
        if kind in VISION_FIRST
        else None
    )
    pad = processor.tokenizer.pad_token_id
    budget = minutes * 60
    t0 = time.time()
    step, best, history = 0, -1.0, []
    model.train()

    def done() -> bool:
        return (max_steps is not None and step >= max_steps) or (
            max_steps is None and time.time() - t0 >= budget
        )

    while not done():
        # the schedule follows steps when they are fixed (bit-reproducible), else the clock
        frac = step / max_steps if max_steps else min(1.0, (time.time() - t0) / budget)
        for group in opt.param_groups:  # warm-up, then cosine decay over the time budget
            group["lr"] = (
                lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            )
        source = first if first is not None and step < vision_steps else stream
        batch = collate([next(source)[1] for _ in range(batch_size)], pad)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0:
            log(
                f"[{kind}] step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e} {time.time() - t0:.0f}s"
            )
        if step % eval_every == 0 or done():
            model.eval()
            metrics = evaluate(kind, model, processor)
            model.train()
            score = float(np.mean(list(metrics.values())))
            history.append({"step": step, "seconds": time.time() - t0, **metrics})
            log(
                f"[{kind}] eval step {step}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            )
            if score > best:
                best = score
                _save(model, processor, out)
    if best < 0:  # the budget ended before the first evaluation
        _save(model, processor, out)
    record = {
        "seed": seed,
        "minutes": minutes,
        "max_steps": max_steps,
        "steps": step,
        "tasks": list(tasks or TASKS[kind]),
        "history": history,
    }
    (out / "training_history.json").write_text(json.dumps(record, indent=1))
    return out


def _save(model: Any, processor: Any, out: Path) -> None:
    from .tiny import _quiet_save

    out.mkdir(parents=True, exist_ok=True)
    _quiet_save(model, out)
    processor.save_pretrained(out)
