"""Throughput against the raw model, and parallel vs sequential speculation (prints figures).

1. Ceiling ratio: for the speculation phase and the judge phase, ``graph.batch(N)`` and
   ``graph.abatch(N)`` (``--drivers``) against
   the same requests prepared and run straight through the model's batched path (same
   process, same batch size), with where the rest of the time goes.
2. ``speculation="after_judge"`` vs ``"parallel"`` on the mixed workload (judge, drafts,
   agent loops), side by side: throughput, per-query latency p50/p95 (by route, batched and
   one query at a time), mean batch size per model, discarded drafts.

Models: ``--models tiny`` (random tiny Qwen-VL checkpoints; the judge's real cost with a
fixed 3-in-4 tool-free decision, tau at the median draft score) or ``--models demo`` (the
shipped demo checkpoints, their own decisions), or both (default).

   With ``--offloaded-s`` (default 0.1) the speculation phase runs once more with each of
   the small model's batches a wait of that long that holds no CPU and no GIL, as the host
   sees a model on an accelerator: the graph's time against the raw path's (preparation,
   then the batches, one after the other) says whether preparation overlaps the model.

3. Orchestration: host CPU per query with models that answer at once (``graph.abatch`` of
   ``--in-flight`` queries) against LangGraph's own floor, five no-op nodes, same run.

The speculation phase is also run as a user would write it without us (``hand_written_loop``:
transformers' Auto classes, Pillow, batched ``generate`` chunk after chunk); the graph's time
against it is its *efficiency* (1.0: the graph costs nothing over the hand-written loop).

Usage: python3 scripts/bench_throughput.py [--n 64] [--reps 3] [--models tiny demo]
                                           [--parts ceiling speculation orchestration]
       python3 scripts/bench_throughput.py --quick     # what CI prints (about 90 s)
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

import numpy as np
import torch

from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.benchmarks.throughput import (
    FixedDecisionJudge,
    ceiling,
    compare_speculation,
    orchestration_vs_floor,
    shape_queries,
    speculation_report,
)
from speceyes_graph.models import ChatTransformersVLM


def setup(kind: str, folder: Path, n: int, batch: int):
    """(small, large, queries, graph settings, make_graph for the mixed workload)."""
    if kind == "demo":
        from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models, demo_queries

        models = demo_models(batch_size=batch)
        queries = [
            {"question": q.question, "images": [q.image], "options": q.options}
            for q in demo_queries(folder, n, seed=11)
        ]

        def make_graph(speculation: str):
            return create_speceyes_graph(
                speculator=models["small"],
                agent=models["large"],
                speculation=speculation,
                **DEMO_GRAPH_SETTINGS,
            )

        return models["small"], models["large"], queries, DEMO_GRAPH_SETTINGS, make_graph

    from speceyes_graph.demo.tiny import cached_tiny_models

    paths = cached_tiny_models()
    small = ChatTransformersVLM(
        model=str(paths["small"]), top_logprobs=64, max_new_tokens=20, max_batch_size=batch
    )
    large = ChatTransformersVLM(model=str(paths["large"]), max_new_tokens=24, max_batch_size=batch)
    queries = shape_queries(folder, n)
    decisions = {q["question"]: ("yes" if i % 4 == 3 else "no") for i, q in enumerate(queries)}
    drafts = (
        create_speceyes_graph(speculator=small, mode="small")
        .compile()
        .batch(queries, {"max_concurrency": n})
    )
    tau = float(np.median([d["draft"]["score"] for d in drafts]))

    def make_graph(speculation: str):
        judge = FixedDecisionJudge(inner=large, decisions=decisions)
        return create_speceyes_graph(
            judge=judge,
            speculator=small,
            agent=large,
            gate=GateConfig(tau=tau),
            loop=LoopOptions(max_steps=3),
            speculation=speculation,
        )

    return small, large, queries, {}, make_graph


def hand_written_loop(
    model: ChatTransformersVLM,
    queries: list[dict],
    settings: dict,
    *,
    batch: int = 16,
    reps: int = 3,
) -> float:
    """The speculation phase as a user would write it without us (median seconds): the same
    checkpoint loaded with transformers' Auto classes, each chunk of ``batch`` queries opened
    with Pillow, resized to the model's frame, templated and processed, then one batched
    ``generate`` with the top-K log-probs the gate scores; chunk after chunk, nothing
    overlapped. The same model calls the graph makes, on the same images."""
    import statistics
    import time

    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from speceyes_graph.prompts import Prompts
    from speceyes_tools.images import smart_resize

    prompts = settings.get("prompts") or Prompts()
    spec = model.resize_spec
    path = model.model
    processor = AutoProcessor.from_pretrained(path)
    processor.tokenizer.padding_side = "left"
    hf_model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    max_tokens, top_k = settings.get("draft_max_tokens", 20), model.top_logprobs or 64

    def run() -> list[str]:
        answers: list[str] = []
        for start in range(0, len(queries), batch):
            chunk = queries[start : start + batch]
            images, texts = [], []
            for q in chunk:
                image = Image.open(q["images"][0]).convert("RGB")
                h, w = smart_resize(
                    image.height, image.width, spec.factor, spec.min_pixels, spec.max_pixels
                )
                images.append(image.resize((w, h), Image.Resampling.BICUBIC))
                text = prompts.question(q["question"], q.get("options")) + prompts.speculator_suffix
                messages = [
                    {
                        "role": "system",
                        "content": [{"type": "text", "text": prompts.speculator_system}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "image"}, {"type": "text", "text": text}],
                    },
                ]
                texts.append(
                    processor.apply_chat_template(
                        messages, add_generation_prompt=True, tokenize=False
                    )
                )
            inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
            with torch.inference_mode():
                out = hf_model.generate(
                    **inputs,
                    max_new_tokens=max_tokens,
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_logits=True,
                    pad_token_id=processor.tokenizer.pad_token_id,
                )
                for logits in out.logits:  # what the gate scores: top-K log-probs per token
                    torch.log_softmax(logits.float(), dim=-1).topk(top_k)
            new = out.sequences[:, inputs["input_ids"].shape[1] :]
            answers += processor.batch_decode(new, skip_special_tokens=True)
        return answers

    run()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size of each model")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=["tiny", "demo"], default=["tiny", "demo"])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["ceiling", "speculation", "orchestration"],
        default=["ceiling", "speculation", "orchestration"],
    )
    parser.add_argument(
        "--drivers", nargs="+", choices=["batch", "abatch"], default=["batch", "abatch"]
    )
    parser.add_argument(
        "--in-flight", type=int, default=1000, help="queries in flight for --parts orchestration"
    )
    parser.add_argument(
        "--offloaded-s",
        type=float,
        default=0.1,
        help="also run the speculation phase with each batch a wait of this long, off the CPU "
        "(the model on an accelerator, as the host sees it); 0: not",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="what CI prints: demo checkpoints, speculation phase and orchestration, 3 reps",
    )
    args = parser.parse_args()
    if args.quick:
        args.models, args.parts, args.reps = ["demo"], ["ceiling", "orchestration"], 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models:
            folder = Path(tmp) / kind
            folder.mkdir()
            small, large, queries, settings, make_graph = setup(kind, folder, args.n, args.batch)
            print(f"\n=== {kind} checkpoints, N={args.n}, batch size {args.batch} ===")
            if "ceiling" in args.parts:
                hand = hand_written_loop(small, queries, settings, batch=args.batch, reps=args.reps)
                measure = functools.partial(
                    ceiling, small=small, large=large, queries=queries, reps=args.reps,
                    graph_settings=settings,
                )  # fmt: skip
                for phase in ("speculation", "judge")[: 1 if args.quick else 2]:
                    for driver in args.drivers:
                        result = measure(phase, driver=driver, orchestration=not args.quick)
                        print(result.report())
                        if phase == "speculation":
                            print(
                                f"   efficiency: a hand-written transformers loop of the same "
                                f"calls takes {hand:.2f} s -> graph.{driver} at "
                                f"{hand / result.graph_s:.2f} of it"
                            )
                if args.offloaded_s:  # does the preparation overlap the model's batches?
                    for driver in args.drivers:
                        result = measure(
                            "speculation",
                            driver=driver,
                            orchestration=False,
                            offloaded_s=args.offloaded_s,
                        )
                        print(result.report())
            if "orchestration" in args.parts:
                print(orchestration_vs_floor(queries, n=args.in_flight, reps=args.reps).report())
            if "speculation" in args.parts:
                results = compare_speculation(
                    make_graph,
                    queries,
                    {"small": small, "large": large},
                    reps=max(1, args.reps - 1),
                )
                print(f"mixed workload, {args.n} queries at concurrency {args.n}:")
                print(speculation_report(results))


if __name__ == "__main__":
    main()
