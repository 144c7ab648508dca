"""Mixed image sizes stay one batch, for every family (prints figures; docs/models.md).

For each of the eleven tiny families (``speceyes_graph.demo.tiny_families``: real classes and
processors, random tiny weights), eight speculation requests whose images all differ in
size, three ways, in the same process:

- ``one by one``: ``ChatTransformersVLM.invoke`` eight times;
- ``batch``: ``ChatTransformersVLM.batch`` of the eight (what the graph's ``batch`` gives the
  model): the batch size the replies report, and the time;
- ``hand-written``: what a user writes without us: the family's processor over the eight
  prompts at once, one ``generate``.

Before the family fix, a batch of mixed sizes failed to collate and was retried one by one
(right answers, no batching): the ``rows`` column is what shows it.

Usage: python3 scripts/bench_families.py [--reps 3] [--families gemma3 mistral3 ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from speceyes_graph.demo.tiny_families import FAMILIES, PALIGEMMA_CHAT_TEMPLATE, make_tiny_family
from speceyes_graph.messages import user_message
from speceyes_graph.models import ChatTransformersVLM
from speceyes_tools import ImageStore
from speceyes_tools.images import store_scope

SIZES = ((40, 30), (90, 60), (33, 77), (64, 64), (120, 45), (50, 100), (77, 33), (30, 30))
QUESTION = "What colour is the block in the corner? Answer with one word."


def _pictures(folder: Path) -> list[str]:
    paths = []
    for seed, (w, h) in enumerate(SIZES):
        arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
        arr[: h // 2, : w // 2] = (220, (40 * seed) % 256, 30)
        path = folder / f"p{seed}.png"
        Image.fromarray(arr).save(path)
        paths.append(str(path))
    return paths


def _timed(fn, reps: int) -> tuple[float, object]:
    """Median wall time over ``reps`` runs after one warm-up, and the last result."""
    result = fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_family(family: str, folder: Path, pictures: list[str], reps: int) -> dict:
    kwargs = {"processor_kwargs": {"chat_template": PALIGEMMA_CHAT_TEMPLATE}}
    model = ChatTransformersVLM(
        model=str(make_tiny_family(family, folder / family)),
        top_logprobs=8,
        max_new_tokens=8,
        **(kwargs if family == "paligemma" else {}),
    )
    store = ImageStore()
    with store_scope(store):
        requests = [[user_message([p], QUESTION, model.resize_spec, store)] for p in pictures]
        alone_s, alone = _timed(lambda: [model.invoke(r) for r in requests], reps)
        batch_s, batched = _timed(lambda: model.batch(requests), reps)
    same = [a.content for a in alone] == [b.content for b in batched]  # type: ignore[union-attr]
    rows = max(m.response_metadata["batch_size"] for m in batched)  # type: ignore[union-attr]
    hand_s = _hand_written(model, pictures, store, reps)
    return {
        "family": family,
        "rows": rows,
        "same": same,
        "one_by_one_s": alone_s,
        "batch_s": batch_s,
        "hand_s": hand_s,
    }


def _hand_written(model: ChatTransformersVLM, pictures: list[str], store, reps: int) -> float:
    """The family's processor over all eight prompts, one ``generate``: no library."""
    processor, hf_model = model.processor, model.hf_model
    images = [[Image.open(p).convert("RGB")] for p in pictures]
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]  # fmt: skip
    text = processor.apply_chat_template(conversation, add_generation_prompt=True)
    bos = processor.tokenizer.bos_token
    extra = {"add_special_tokens": False} if bos and text.startswith(bos) else {}

    def run() -> None:
        inputs = processor(text=[text] * len(images), images=images, return_tensors="pt",
                           padding=True, **extra)  # fmt: skip
        with torch.inference_mode():
            hf_model.generate(**inputs, max_new_tokens=8, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)  # fmt: skip

    return _timed(run, reps)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    args = parser.parse_args()
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="bench-families-"))
    pictures = _pictures(folder)
    print(f"8 requests, images {', '.join(f'{w}x{h}' for w, h in SIZES)}; median of {args.reps}")
    print(f"{'family':<16} {'rows':>4} {'same':>5} {'one by one':>11} {'batch':>8} "
          f"{'speedup':>8} {'hand-written':>13} {'batch/hand':>11}")  # fmt: skip
    for family in args.families:
        r = bench_family(family, folder, pictures, args.reps)
        print(
            f"{family:<16} {r['rows']:>4} {str(r['same']):>5} {r['one_by_one_s'] * 1e3:>9.0f}ms "
            f"{r['batch_s'] * 1e3:>6.0f}ms {r['one_by_one_s'] / r['batch_s']:>7.2f}x "
            f"{r['hand_s'] * 1e3:>11.0f}ms {r['batch_s'] / r['hand_s']:>10.2f}x"
        )
    print("rows: requests in the largest generate call (8: one batch); same: the batch's replies "
          "equal one by one's")  # fmt: skip


if __name__ == "__main__":
    main()
