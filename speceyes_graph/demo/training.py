"""Training the embedded demo checkpoints on the demo world (:mod:`.world`), on a CPU.

Two real architectures, trained from scratch with the same tokenizer/processor path as real
checkpoints and saved with ``save_pretrained``:

- **small** (Qwen3-VL, 1.4M parameters): answers from the downscaled whole image (the
  speculator). It learns large objects; tiny ones stay a guess, which its logits show.
  A second stage (``init_from`` the first, ``small_zoom``/``small_after_zoom`` weights)
  teaches it the depth-1 loop: one zoom in its own 128 px frame, then the answer.
- **large** (Qwen2.5-VL, 2.75M parameters): answers the published judge prompt (yes = tools
  help = tiny object), and as the agent thinks, zooms on the named region with a DeepEyes
  ``image_zoom_in_tool`` call, thinks over the crop and answers.

What makes this train on two CPU cores (measured; see the project's training notes): image
normalisation centred on the light background (mean 0.9, std 0.3), so the vision tower's
gradients do not collapse; colour words instead of option letters; one task per batch;
a first stage on colour alone (from crops and large objects) so the vision tower learns
colour before the text prior takes over; a warm-up then cosine learning-rate schedule over
the budget; the checkpoint with the best held-out evaluation is kept.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .world import (
    DEMO_TOKENS,
    LARGE_FRAME,
    LARGE_SPEC,
    SMALL_FRAME,
    SMALL_SPEC,
    Scene,
    conversations,
    corpus,
    make_scene,
    region_box,
)

__all__ = [
    "DEMO_ARCH",
    "TASK_WEIGHTS",
    "build_demo_model",
    "build_demo_processor",
    "collate",
    "encode",
    "evaluate",
    "train_demo",
]


def build_demo_processor(kind: str) -> Any:
    """Tokenizer + real processor classes, normalised around the light background."""
    from .tiny import _processor, build_tokenizer

    tok = build_tokenizer(1024, corpus(), extra_tokens=DEMO_TOKENS)
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

# Share of batches per task once the colour stage is over (each batch holds one task).
TASK_WEIGHTS = {
    "small": {"draft": 1.0},
    "large": {
        "judge": 0.15,
        "zoom": 0.25,
        "after_zoom": 0.35,
        "colour_crop": 0.15,
        "colour_full": 0.1,
    },
}
COLOUR_STAGE = {"small": {}, "large": {"colour_crop": 0.6, "colour_full": 0.4}}


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


def batches(
    processor: Any,
    rng: np.random.Generator,
    weights: dict[str, float],
    batch_size: int,
    tiny_share: float = 0.5,
    micro_share: float = 0.0,
) -> Iterator[tuple[str, dict]]:
    """Endless (task, collated batch) pairs: one task per batch, fresh scenes, ``tiny_share``
    of them tiny (half by default; the exact half-split draw when it is 0.5), ``micro_share``
    of the tiny ones micro (none by default, and then no draw: older runs stay reproducible)."""
    tasks, p = list(weights), np.array(list(weights.values()))
    pad = processor.tokenizer.pad_token_id
    while True:
        task = tasks[int(rng.choice(len(tasks), p=p / p.sum()))]
        samples: list[dict] = []
        while len(samples) < batch_size:
            if task == "colour_full":
                tiny = False
            elif tiny_share == 0.5:
                tiny = bool(rng.integers(0, 2))
            else:
                tiny = bool(rng.random() < tiny_share)
            micro = tiny and micro_share > 0 and bool(rng.random() < micro_share)
            scene = make_scene(rng, tiny, micro=micro)
            samples.append(encode(processor, *conversations(scene)[task]))
        yield task, collate(samples, pad)


# --- evaluation (greedy, on held-out scenes) -------------------------------------------------------

EVAL_TASKS = {
    "small": ("draft", "small_zoom", "small_after_zoom"),
    "large": ("judge", "zoom", "after_zoom"),
}
# The frame each tool-call task's box is written in (the box is right when it equals the
# region's box there, token for token).
ZOOM_FRAMES = {"zoom": LARGE_FRAME, "small_zoom": SMALL_FRAME}


def held_out_scenes(n: int = 64, seed: int = 10_000, micro: int = 0) -> list[Scene]:
    """Half tiny, half large, from a seed range training never uses; ``micro`` micro scenes
    after them (from a generator of their own, so the first ``n`` do not change)."""
    rng = np.random.default_rng(seed)
    scenes = [make_scene(rng, tiny=i % 2 == 1) for i in range(n)]
    rng = np.random.default_rng(seed + 1)
    return scenes + [make_scene(rng, tiny=True, micro=True) for _ in range(micro)]


def evaluate(kind: str, model: Any, processor: Any, scenes: list[Scene]) -> dict[str, float]:
    """Greedy accuracy per task and object size, each task given the right inputs."""
    import torch

    from ..protocol import extract_answer, parse_deepeyes

    tok = processor.tokenizer
    tok.padding_side = "left"
    hits: dict[str, list[bool]] = {}
    for task in EVAL_TASKS[kind]:
        for start in range(0, len(scenes), 16):
            chunk = scenes[start : start + 16]
            convs = [conversations(s)[task] for s in chunk]
            prompts = [
                processor.apply_chat_template(c[0], add_generation_prompt=True, tokenize=False)
                for c in convs
            ]
            inputs = processor(
                text=prompts,
                images=[im for c in convs for im in c[1]],
                return_tensors="pt",
                padding=True,
            )
            with torch.inference_mode():
                out = model.generate(**inputs, max_new_tokens=192, do_sample=False)
            texts = tok.batch_decode(
                out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
            )
            for scene, text in zip(chunk, texts, strict=True):
                size = "micro" if scene.micro else "tiny" if scene.tiny else "large"
                if task == "draft":
                    ok = text.strip() == scene.colour
                elif task == "judge":
                    ok = text.strip().lower().startswith("yes" if scene.tiny else "no")
                elif task in ZOOM_FRAMES:
                    calls = parse_deepeyes(text, {"image_zoom_in_tool"}).tool_calls
                    box = region_box(scene.region, ZOOM_FRAMES[task])
                    ok = bool(calls) and calls[0]["args"].get("bbox_2d") == box
                else:
                    ok = extract_answer(text) == scene.colour
                hits.setdefault(f"{task}_{size}", []).append(ok)
    return {k: float(np.mean(v)) for k, v in sorted(hits.items())}


def _selection_score(kind: str, metrics: dict[str, float]) -> float:
    """What "best checkpoint" means: the large model's end-to-end chance on tiny objects
    (box right and answer right) with its other skills. The small model's tool-free draft on
    large objects (the queries it speculates on without tools) and its depth-1 loop end to
    end, per size (box right and answer right); its tool-free draft on tiny objects is left
    out: it stays at chance (the dots are below what it resolves) and would only add noise."""
    if kind == "small":
        loop = [
            metrics[f"small_zoom_{s}"] * metrics[f"small_after_zoom_{s}"] for s in ("tiny", "large")
        ]
        return float(np.mean([metrics["draft_large"], *loop]))
    e2e = metrics["zoom_tiny"] * metrics["after_zoom_tiny"]
    if "after_zoom_micro" in metrics:  # trained on micro targets: they count as much
        e2e = (e2e + metrics["zoom_micro"] * metrics["after_zoom_micro"]) / 2
    rest = [metrics[k] for k in ("judge_tiny", "judge_large", "zoom_large", "after_zoom_large")]
    return e2e + float(np.mean(rest))


# --- training loop ----------------------------------------------------------------------------------


def train_demo(
    out_dir: str | Path,
    kind: str,
    *,
    minutes: float = 45.0,
    seed: int = 0,
    batch_size: int = 16,
    lr: float = 1.5e-3,
    warmup: int = 50,
    colour_steps: int = 200,
    eval_every: int = 250,
    threads: int | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    position: int = 0,
    init_from: str | Path | None = None,
    task_weights: dict[str, float] | None = None,
    log: Callable[[str], None] | None = None,
    tiny_share: float = 0.5,
    micro_share: float = 0.0,
) -> Path:
    """Train one demo checkpoint for a wall-clock budget (or ``max_steps``); keep the best.

    The learning rate warms up over ``warmup`` steps, then decays on a cosine to a tenth
    over the budget (by the clock, or by steps when they are fixed: bit-reproducible).
    The large model spends its first ``colour_steps`` on colour alone. A progress bar
    (``position`` stacks the bars of parallel trainings) runs over the steps or seconds;
    ``log`` receives the loss and evaluation lines (default: printed above the bar).
    ``init_from`` continues from a saved checkpoint (a second stage, with its own
    ``task_weights``, usually a lower ``lr`` and ``colour_steps=0``). ``tiny_share``: the
    share of tiny-object scenes in a batch; raising it closes a shortcut: with a large object
    in view a model learns to zoom where the object is, not where the question says, and
    only tiny scenes (four dots, one per colour) force it to read the region name.
    """
    import torch

    from ..progress import progress_bar

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    out = Path(out_dir) / kind
    if init_from is not None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        processor = AutoProcessor.from_pretrained(init_from)
        model = AutoModelForImageTextToText.from_pretrained(init_from)
        _add_missing_tokens(processor, model)
    else:
        processor = build_demo_processor(kind)
        model = build_demo_model(kind, processor.tokenizer, seed)
    weights = task_weights or TASK_WEIGHTS[kind]
    n_params = sum(p.numel() for p in model.parameters())
    (log or print)(
        f"[{kind}] {type(model).__name__}: {n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} threads"
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = np.random.default_rng(seed)
    main = batches(processor, rng, weights, batch_size, tiny_share, micro_share)
    first = (
        batches(processor, rng, COLOUR_STAGE[kind], batch_size)
        if colour_steps and COLOUR_STAGE[kind]
        else None
    )
    scenes = held_out_scenes(micro=32 if micro_share else 0)
    budget = minutes * 60
    bar = progress_bar(
        total=max_steps or round(budget),
        unit="step" if max_steps else "s",
        desc=f"train {kind}",
        position=position,
        disable=not progress,
    )
    say = log or bar.write
    t0 = time.time()
    step, best, history = 0, -1.0, []
    losses: dict[str, list[float]] = {}
    model.train()

    def elapsed() -> float:  # share of the budget spent (not ``progress``: the bar's flag)
        return step / max_steps if max_steps else (time.time() - t0) / budget

    while elapsed() < 1.0:
        for group in opt.param_groups:
            group["lr"] = (
                lr
                * min(1.0, (step + 1) / warmup)
                * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed()))))
            )
        task, batch = next(first if first is not None and step < colour_steps else main)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.setdefault(task, []).append(loss.item())
        bar.update(1 if max_steps else min(round(budget), round(time.time() - t0)) - bar.n)
        if step % 25 == 0:
            mean = ", ".join(f"{t} {np.mean(v[-10:]):.3f}" for t, v in sorted(losses.items()))
            say(
                f"[{kind}] step {step} lr {opt.param_groups[0]['lr']:.2e} {time.time() - t0:.0f}s loss {mean}"
            )
        if step % eval_every == 0 or elapsed() >= 1.0:
            model.eval()
            metrics = evaluate(kind, model, processor, scenes)
            model.train()
            score = _selection_score(kind, metrics)
            history.append(
                {"step": step, "seconds": round(time.time() - t0, 1), "score": score, **metrics}
            )
            say(
                f"[{kind}] eval step {step}: score {score:.3f} "
                + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            )
            if score >= best:  # ties: the later, longer-trained checkpoint
                best = score
                _save(model, processor, out)
    bar.close()
    if best < 0:  # the budget ended before the first evaluation
        _save(model, processor, out)
    record = {
        "seed": seed,
        "minutes": minutes,
        "max_steps": max_steps,
        "steps": step,
        "batch_size": batch_size,
        "lr": lr,
        "colour_steps": colour_steps,
        "task_weights": weights,
        "tiny_share": tiny_share,
        "micro_share": micro_share,
        "init_from": str(init_from) if init_from else None,
        "previous_stage": _history(init_from) if init_from else None,
        "best_score": best,
        "history": history,
    }
    (out / "training_history.json").write_text(json.dumps(record, indent=1))
    return out


def _add_missing_tokens(processor: Any, model: Any) -> None:
    """A checkpoint from before a world token was added gets it (a new embedding row, the
    mean of the others), so a second stage can continue an earlier checkpoint."""
    from .tiny import _added

    vocab = processor.tokenizer.get_vocab()
    missing = [t for t in DEMO_TOKENS if t not in vocab]
    if missing:
        processor.tokenizer.add_tokens([_added(t) for t in missing])
        model.resize_token_embeddings(len(processor.tokenizer))


def _history(checkpoint: str | Path) -> dict | None:
    path = Path(checkpoint) / "training_history.json"
    return json.loads(path.read_text()) if path.exists() else None


def _save(model: Any, processor: Any, out: Path) -> None:
    from .tiny import _quiet_save

    out.mkdir(parents=True, exist_ok=True)
    _quiet_save(model, out)
    processor.save_pretrained(out)
