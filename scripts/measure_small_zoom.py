"""Measure the demo checkpoints' depth-1 zoom loop on held-out scenes (greedy generation).

The small model (128 px frame) on the training evaluation's held-out scenes (half tiny,
half large): its tool-free draft; its zoom box (right = the named region's box in its frame)
and its answer after the oracle crop; and end to end: its own box through the real
image_zoom_in_tool's crop and tool text, then its answer. For information, a candidate harder
query kind, "micro" scenes (tiny scenes with a 5-8 px target; the three distractor dots stay
12-16 px), end to end after one zoom, for the small model and for the large model (its own
``zoom``/``after_zoom`` turns in its 112 px frame). The large model's end-to-end figures on
the held-out scenes are printed for reference.

    PYTHONPATH=. .venv/bin/python scripts/measure_small_zoom.py [--n 64] [--threads 2]
        [--small speceyes_graph/demo/checkpoints/small] [--large ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from langchain_core.tools import ToolException
from transformers import AutoModelForImageTextToText, AutoProcessor

from speceyes_graph.demo.training import evaluate, held_out_scenes
from speceyes_graph.demo.world import (
    LARGE_FRAME,
    SMALL_FRAME,
    Frame,
    Scene,
    after_tool,
    conversations,
    make_scene,
    region_box,
    tool_crop,
)
from speceyes_graph.protocol import extract_answer, parse_deepeyes

CHECKPOINTS = Path(__file__).resolve().parents[1] / "speceyes_graph" / "demo" / "checkpoints"
MICRO_SIDE = (5, 8)


def micro_scenes(n: int, seed: int = 10_000) -> list[Scene]:
    """Tiny scenes (four dots, four colours) whose target is 5-8 px: at the first crop's
    112/128 px view it is still a 2-3 px dot."""
    rng = np.random.default_rng(seed)
    return [make_scene(rng, tiny=True, target_side=MICRO_SIDE) for _ in range(n)]


def generate(model, processor, convs: list[tuple[list[dict], list[np.ndarray]]]) -> list[str]:
    tok = processor.tokenizer
    tok.padding_side = "left"
    texts = []
    for start in range(0, len(convs), 16):
        chunk = convs[start : start + 16]
        prompts = [
            processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
            for m, _ in chunk
        ]
        inputs = processor(
            text=prompts,
            images=[im for _, ims in chunk for im in ims],
            return_tensors="pt",
            padding=True,
        )
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=192, do_sample=False)
        texts += tok.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def end_to_end(model, processor, scenes: list[Scene], task: str, frame: Frame) -> dict[str, float]:
    """The zoom turn as generated, the real tool's crop of the model's own box, the answer turn
    generated over it (the model's own call text stays in the history, as in the graph)."""
    firsts = [conversations(s)[task][:2] for s in scenes]
    calls_text = generate(model, processor, firsts)
    follow, box_ok, valid = [], [], []
    for scene, (messages, images), text in zip(scenes, firsts, calls_text, strict=True):
        calls = parse_deepeyes(text, {"image_zoom_in_tool"}).tool_calls
        bbox = calls[0]["args"].get("bbox_2d") if calls else None
        box_ok.append(bbox == region_box(scene.region, frame))
        try:
            crop, tool_text = tool_crop(scene.image, bbox, frame)
        except (ToolException, TypeError):  # no call, or a box the tool rejects: no answer
            valid.append(False)
            continue
        valid.append(True)
        follow.append((after_tool(messages, text, tool_text), [*images, crop]))
    answers = iter(generate(model, processor, follow))
    right = [
        ok and extract_answer(next(answers)) == s.colour
        for s, ok in zip(scenes, valid, strict=True)
    ]
    return {
        "box": float(np.mean(box_ok)),
        "called": float(np.mean(valid)),
        "e2e": float(np.mean(right)),
    }


def by_size(fn, scenes: list[Scene]) -> dict[str, dict[str, float]]:
    return {
        size: fn([s for s in scenes if s.tiny == (size == "tiny")]) for size in ("tiny", "large")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--small", default=str(CHECKPOINTS / "small"))
    ap.add_argument("--large", default=str(CHECKPOINTS / "large"))
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    held, micro = held_out_scenes(args.n), micro_scenes(args.n)
    models = {}
    for kind, path in (("small", args.small), ("large", args.large)):
        proc = AutoProcessor.from_pretrained(path)
        models[kind] = (AutoModelForImageTextToText.from_pretrained(path).eval(), proc)
    t0 = time.time()
    small, large = models["small"], models["large"]
    report = {
        "n": args.n,
        "checkpoints": {"small": args.small, "large": args.large},
        # the training evaluation: draft, box, answer after the oracle crop, per size
        "small_eval": evaluate("small", *small, held),
        "small_e2e": by_size(lambda s: end_to_end(*small, s, "small_zoom", SMALL_FRAME), held),
        "large_e2e": by_size(lambda s: end_to_end(*large, s, "zoom", LARGE_FRAME), held),
        "micro_small_eval": evaluate("small", *small, micro),
        "micro_small_e2e": end_to_end(*small, micro, "small_zoom", SMALL_FRAME),
        "micro_large_eval": evaluate("large", *large, micro),
        "micro_large_e2e": end_to_end(*large, micro, "zoom", LARGE_FRAME),
    }
    report["seconds"] = round(time.time() - t0, 1)
    ev, e2e = report["small_eval"], report["small_e2e"]
    print(f"small checkpoint {args.small}, {args.n} held-out scenes (half tiny), greedy")
    for size in ("tiny", "large"):
        print(
            f"  {size:5}  draft {ev[f'draft_{size}']:.3f}  box {ev[f'small_zoom_{size}']:.3f}  "
            f"answer after oracle crop {ev[f'small_after_zoom_{size}']:.3f}  "
            f"end to end {e2e[size]['e2e']:.3f} (own box right {e2e[size]['box']:.3f})"
        )
    for size in ("tiny", "large"):
        r = report["large_e2e"][size]
        print(f"  large model, {size:5}: end to end {r['e2e']:.3f} (own box right {r['box']:.3f})")
    ms, ml = report["micro_small_eval"], report["micro_large_eval"]
    print(f"micro scenes (target {MICRO_SIDE[0]}-{MICRO_SIDE[1]} px), {args.n}:")
    r = report["micro_small_e2e"]
    print(
        f"  small: end to end {r['e2e']:.3f} (own box right {r['box']:.3f}); "
        f"draft {ms['draft_tiny']:.3f}, answer after oracle crop {ms['small_after_zoom_tiny']:.3f}"
    )
    r = report["micro_large_e2e"]
    print(
        f"  large: end to end {r['e2e']:.3f} (own box right {r['box']:.3f}); "
        f"judge yes {ml['judge_tiny']:.3f}, answer after oracle crop {ml['after_zoom_tiny']:.3f}"
    )
    print(f"({report['seconds']} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
