"""Batch evaluation of a folder of images: progress bar, cross-query batching, a CSV.

Runs the real local backend (``ChatTransformersVLM``) on the tiny random checkpoints (built
once into the user cache), so the answers are noise; point ``--small``/``--large`` at real
checkpoints for real answers. Usage: python examples/batch_folder.py [FOLDER] [--csv OUT]
"""

import argparse
import csv
import tempfile
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.benchmarks import generate_suite
from speceyes_graph.demo.tiny import cached_tiny_models
from speceyes_graph.models import ChatTransformersVLM

parser = argparse.ArgumentParser()
parser.add_argument("folder", nargs="?", help="images to ask about (default: 16 synthetic scenes)")
parser.add_argument("--question", default="What is the color of the circle?")
parser.add_argument("--small")
parser.add_argument("--large")
parser.add_argument("--csv", default="speceyes_results.csv")
args = parser.parse_args()

folder = (
    Path(args.folder)
    if args.folder
    else generate_suite(
        Path(tempfile.mkdtemp()) / "suite", 16, seed=0, max_side=1920, progress=False
    )
)
images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
tiny = cached_tiny_models()
small = ChatTransformersVLM(
    model=args.small or str(tiny["small"]), top_logprobs=16, max_new_tokens=8, max_batch_size=16
)
large = ChatTransformersVLM(
    model=args.large or str(tiny["large"]), max_new_tokens=16, max_batch_size=16
)
graph = create_speceyes_graph(
    speculator=small, agent=large, gate=GateConfig(k=16), loop=LoopOptions(max_steps=2)
).compile()

inputs = [
    {"question": args.question, "images": [str(p)], "options": ["red", "green", "blue", "yellow"]}
    for p in images
]
rows, t0 = [None] * len(inputs), time.perf_counter()
with tqdm(total=len(inputs), desc="speceyes", unit="img") as bar:
    for i, out in graph.batch_as_completed(inputs, {"max_concurrency": 16}):
        draft = out.get("draft") or {}
        rows[i] = {
            "file": images[i].name,
            "route": out.get("route"),
            "answer": out.get("answer"),
            "draft_score": draft.get("score"),
            "error": out.get("error"),
            **{f"{k}_s": round(v, 3) for k, v in out.get("timings", {}).items()},
        }
        bar.update(1)
with open(args.csv, "w", newline="") as fh:
    fields = sorted(
        {k for r in rows for k in r},
        key=lambda k: (k not in ("file", "route", "answer", "draft_score", "error"), k),
    )
    writer = csv.DictWriter(fh, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
print(f"{len(rows)} images in {time.perf_counter() - t0:.1f} s -> {args.csv}")
print("routes:", dict(Counter(r["route"] for r in rows)))
print(
    f"generate calls: small {small.scheduler.stats.calls}, large {large.scheduler.stats.calls} (batched across images)"
)
