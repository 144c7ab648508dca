"""The real architectures at full size (random weights, configs only, no download).

Builds Qwen3-VL-2B-Instruct (the small model) and Qwen2.5-VL-7B (the DeepEyes / Thyme base)
from their published dimensions with random bf16 weights on the GPU, wraps them in
``ChatTransformersVLM`` and measures, in one run:

- ``latency``: judge (10 tokens), speculation (20 tokens, top-64 log-probs) and agent-step
  (128 tokens, image + zoomed crop) latency at batch 1, 8 and 32;
- ``ceiling``: ``graph.batch(N)`` against the raw model for the speculation and judge
  phases (what ``scripts/bench_throughput.py`` does on the CPU checkpoints);
- ``speculation``: ``speculation="after_judge"`` vs ``"parallel"`` on the mixed workload
  (3 in 4 queries judged tool-free by a fixed table, since random weights answer noise;
  tau at the median draft score; agent loops of ``--steps`` steps), side by side;
- ``resolution``: judge, speculation and agent-step latency and peak memory at the paper's
  resolutions (``--megapixels``, 1, 4 and 12.8 MP per image; the processors' pixel cap
  raised to 12,845,056) for batches ``--res-batches`` (1, 8, 16), with the token budget
  (``max_batch_tokens``, the default derived from free memory, or ``--budget``) on and off,
  printing what fits: calls that ran out of memory, batches split, requests failed.

Random weights rarely emit EOS, so every call generates its full length.

On a GPU: python3 scripts/bench_gpu.py
On a CPU, to check the script itself:
    python3 scripts/bench_gpu.py --scale tiny --batches 1 2 --n 8 --reps 1
    python3 scripts/bench_gpu.py --scale tiny --parts resolution --reps 1 --budget 8000
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from langchain_core.messages import AIMessage, SystemMessage

from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.benchmarks.throughput import (
    FixedDecisionJudge,
    ceiling,
    compare_speculation,
    speculation_report,
)
from speceyes_graph.demo.tiny import _processor, build_qwen_vl, build_tokenizer
from speceyes_graph.messages import user_message
from speceyes_graph.models import ChatTransformersVLM
from speceyes_graph.models.memory import TokenBudget, default_batch_tokens
from speceyes_graph.prompts import (
    DEEPEYES_SYSTEM_PROMPT,
    DEEPEYES_USER_PROMPT,
    JUDGE_SYSTEM_PROMPT,
    JUDGE_USER_SUFFIX,
    SPECULATOR_SYSTEM_PROMPT,
    format_question,
)
from speceyes_tools import put_bytes

FULL = {
    "large": {  # Qwen2.5-VL-7B-Instruct
        "text": dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            max_position_embeddings=128000,
            rms_norm_eps=1e-6,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [16, 24, 24],
            },
        ),
        "vision": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=3584,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
            tokens_per_second=2,
        ),
        "tie": False,
    },
    "small": {  # Qwen3-VL-2B-Instruct
        "text": dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=262144,
            rms_norm_eps=1e-6,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        ),
        "vision": dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            out_hidden_size=2048,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17],
            hidden_act="gelu_pytorch_tanh",
        ),
        "tie": True,
    },
}


def shrink(spec: dict) -> dict:
    """The same architectures, a few layers and narrow, to check this script on a CPU."""
    t, v = dict(spec["text"]), dict(spec["vision"])
    heads = 4
    t.update(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
    )
    if "head_dim" in t:
        t["head_dim"] = 16
    t["rope_parameters"] = {**t["rope_parameters"], "mrope_section": [2, 3, 3]}
    v.update(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    if "fullatt_block_indexes" in v:
        v["fullatt_block_indexes"] = [1]
    if "deepstack_visual_indexes" in v:
        v.update(deepstack_visual_indexes=[0], num_position_embeddings=64)
    return {"text": t, "vision": v, "tie": spec["tie"]}


def build(kind: str, scale: str, device: str, dtype: torch.dtype) -> ChatTransformersVLM:
    spec = FULL[kind] if scale == "full" else shrink(FULL[kind])
    tok = build_tokenizer()
    factor = 28 if kind == "large" else 32
    max_pixels = (1280 if scale == "full" else 64) * factor * factor
    processor = _processor(kind, tok, 4 * factor * factor, max_pixels)
    t0 = time.perf_counter()
    with torch.device(device):
        model = build_qwen_vl(kind, tok, spec["text"], spec["vision"], tie=spec["tie"], dtype=dtype)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{kind}: {type(model).__name__} {n / 1e9:.2f}B params, built in {time.perf_counter() - t0:.1f} s on {device}"
    )
    return ChatTransformersVLM.from_components(
        model,
        processor,
        model=f"{kind}-{scale}",
        max_batch_size=64,
        top_logprobs=64 if kind == "small" else None,  # the speculator's gate needs them
    )


def scene(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    arr = np.full((h, w, 3), 240, np.uint8)
    for _ in range(20):
        x, y = int(rng.integers(0, w - 64)), int(rng.integers(0, h - 64))
        arr[y : y + 64, x : x + 64] = rng.integers(0, 255, 3)
    return arr


def image_ref(w: int, h: int, seed: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(scene(w, h, seed)).save(buf, format="PNG")
    return put_bytes(buf.getvalue())


def graph_queries(folder: Path, n: int) -> list[dict]:
    """N queries on 1920x1080 PNG files (each its own image, decoded cold by the graph)."""
    from PIL import Image

    queries = []
    for i in range(n):
        path = folder / f"q{i}.png"
        Image.fromarray(scene(1920, 1080, 1000 + i)).save(path, compress_level=1)
        queries.append(
            {
                "question": f"What is the color of the umbrella? (#{i})",
                "images": [str(path)],
                "options": ["red", "blue", "green", "black"],
            }
        )
    return queries


def graph_parts(small, large, args) -> None:
    """Items 1 and 3 of the throughput work on these models (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        queries = graph_queries(Path(tmp), args.n)
        if "ceiling" in args.parts:
            for phase in ("speculation", "judge"):
                print(
                    ceiling(
                        phase, small=small, large=large, queries=queries, reps=args.reps
                    ).report()
                )
        if "speculation" in args.parts:
            decisions = {
                q["question"]: ("yes" if i % 4 == 3 else "no") for i, q in enumerate(queries)
            }
            drafts = (
                create_speceyes_graph(speculator=small, mode="small")
                .compile()
                .batch(queries, {"max_concurrency": len(queries)})
            )
            tau = float(np.median([d["draft"]["score"] for d in drafts]))

            def make_graph(speculation: str):
                return create_speceyes_graph(
                    judge=FixedDecisionJudge(inner=large, decisions=decisions),
                    speculator=small,
                    agent=large,
                    gate=GateConfig(tau=tau),
                    loop=LoopOptions(max_steps=args.steps),
                    speculation=speculation,
                )

            results = compare_speculation(
                make_graph, queries, {"small": small, "large": large}, reps=max(1, args.reps - 1)
            )
            print(
                f"mixed workload, {len(queries)} queries, agent steps <= {args.steps} of {args.agent_tokens} tokens:"
            )
            print(speculation_report(results))


ZOOM_CALL = (
    '<think>zoom</think><tool_call>{"name": "image_zoom_in_tool", '
    '"arguments": {"bbox_2d": [10, 10, 200, 200]}}</tool_call>'
)


def phase_messages(small, large, image: str, crop: str, q: str) -> tuple[list, list, list]:
    """One query's judge call, draft, and agent step (the image, a zoom call, its crop)."""
    judge = [
        SystemMessage(content=JUDGE_SYSTEM_PROMPT),
        user_message([image], q + JUDGE_USER_SUFFIX, large.resize_spec),
    ]
    draft = [
        SystemMessage(content=SPECULATOR_SYSTEM_PROMPT),
        user_message([image], q + "\nAnswer:", small.resize_spec),
    ]
    step = [
        SystemMessage(content=DEEPEYES_SYSTEM_PROMPT),
        user_message([image], q + DEEPEYES_USER_PROMPT, large.resize_spec),
        AIMessage(content=ZOOM_CALL),
        user_message([crop], DEEPEYES_USER_PROMPT, large.resize_spec),
    ]
    return judge, draft, step


def measure(model: ChatTransformersVLM, batch: list, reps: int, **kwargs) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    model.batch(batch[: min(2, len(batch))], **kwargs)  # warm-up
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        model.batch(batch, **kwargs)
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


PAPER_MAX_PIXELS = 12_845_056  # the published max_pixels (16,384 Qwen2.5-VL tokens)


@contextmanager
def peak_memory():
    """Peak memory of the block in GiB (``result[0]``): allocated CUDA memory on a GPU,
    the process's resident set (sampled every 5 ms) on a CPU."""
    result = [0.0]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        yield result
        torch.cuda.synchronize()
        result[0] = torch.cuda.max_memory_allocated() / 2**30
        return
    import resource

    page, done, peak = resource.getpagesize(), threading.Event(), [0]

    def sample() -> None:
        while not done.wait(0.005):
            with open("/proc/self/statm") as f:
                peak[0] = max(peak[0], int(f.read().split()[1]) * page)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()
        result[0] = peak[0] / 2**30


def set_max_pixels(model: ChatTransformersVLM, max_pixels: int) -> None:
    images = model.processor.image_processor
    images = getattr(images, "inner", images)  # the cache wraps it
    images.size = {"shortest_edge": images.size["shortest_edge"], "longest_edge": max_pixels}


def cold(model: ChatTransformersVLM) -> None:
    """Drop the processed-image and vision-tower caches, so every measurement (budget on or
    off, in whichever order) processes and encodes its images from scratch."""
    encoder = getattr(model.hf_model.base_model, "get_image_features", None)
    for cache in (model.processor.image_processor, encoder):
        if hasattr(cache, "clear"):
            cache.clear()


def phase(model: ChatTransformersVLM, batch: list, reps: int, **kwargs) -> str:
    """Median latency, peak memory and ``generate`` calls of ``model.batch(batch)``, and
    what did not fit (out-of-memory errors, splits, failed requests)."""
    stats = model.scheduler.stats
    oom, split, calls = stats.out_of_memory, stats.split, stats.calls
    times, peaks, failed = [], [], 0
    for _ in range(reps):
        cold(model)
        with peak_memory() as peak:
            t0 = time.perf_counter()
            outs = model.batch(batch, return_exceptions=True, **kwargs)
            times.append(time.perf_counter() - t0)
        peaks.append(peak[0])
        failed = max(failed, sum(isinstance(o, Exception) for o in outs))
    fit = "fits" if stats.out_of_memory == oom else f"{stats.out_of_memory - oom} OOM"
    if stats.split > split:
        fit += f" {stats.split - split} splits"
    if failed:
        fit += f" {failed} failed"
    n_calls = (stats.calls - calls) / reps
    return f"{np.median(times) * 1000:8.1f} ms {max(peaks):6.2f} GiB {n_calls:4.1f} calls {fit:<10}"


def resolution_part(small: ChatTransformersVLM, large: ChatTransformersVLM, args) -> None:
    """Item 4 of the local-engine work: each phase at each resolution and batch, budget on/off."""
    scale = 1.0 if args.scale == "full" else 0.05  # tiny: the same shapes, 1/20 of the pixels
    for m in (small, large):
        set_max_pixels(m, int(PAPER_MAX_PIXELS * scale))
        m.scheduler.max_batch_size = max(args.res_batches)
    budgets = {m.model: args.budget or default_batch_tokens(m.hf_model) for m in (small, large)}
    memory = "peak CUDA memory allocated" if torch.cuda.is_available() else "peak process RSS"
    print(
        f"resolution: max_batch_tokens when on: {budgets}; per phase: median latency, "
        f"{memory}, generate calls per batch, what fit"
    )
    q = format_question("What is the color of the umbrella?", ["red", "blue", "green", "black"])
    for mp in args.megapixels:
        pixels = mp * 1e6 * scale
        w, h = int((pixels * 4 / 3) ** 0.5), int((pixels * 3 / 4) ** 0.5)
        images = [image_ref(w, h, 100 + i) for i in range(max(args.res_batches))]
        crop = image_ref(max(128, w // 4), max(128, h // 4), 998)
        for budget_on in (True, False):
            for m in (small, large):
                m.scheduler.budget = TokenBudget(budgets[m.model] if budget_on else None)
            for b in args.res_batches:
                judge, draft, step = (
                    list(x)
                    for x in zip(
                        *(phase_messages(small, large, images[i], crop, q) for i in range(b)),
                        strict=True,
                    )
                )
                print(
                    f"{mp:5.1f} MP ({w}x{h}) batch {b:>2} budget {'on ' if budget_on else 'off'}"
                    f" | judge {phase(large, judge, args.reps, max_tokens=10)}"
                    f" | draft {phase(small, draft, args.reps, max_tokens=20, top_logprobs=64)}"
                    f" | step {phase(large, step, args.reps, max_tokens=args.agent_tokens)}",
                    flush=True,
                )
    for m in (small, large):
        print(f"{m.model}: budget cuts {m.scheduler.stats.budget_cuts}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", choices=["full", "tiny"], default="full")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--agent-tokens", type=int, default=128)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["latency", "ceiling", "speculation", "resolution"],
        default=["latency", "ceiling", "speculation", "resolution"],
    )
    parser.add_argument("--n", type=int, default=64, help="queries for ceiling and speculation")
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size for those parts")
    parser.add_argument("--steps", type=int, default=2, help="agent loop steps (speculation)")
    parser.add_argument("--megapixels", type=float, nargs="+", default=[1, 4, 12.8])
    parser.add_argument("--res-batches", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument(
        "--budget", type=int, default=None, help="max_batch_tokens when on (default: derived)"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    small, large = (
        build("small", args.scale, device, dtype),
        build("large", args.scale, device, dtype),
    )
    images = [image_ref(1920, 1080, i) for i in range(max(args.batches))]
    q = format_question("What is the color of the umbrella?", ["red", "blue", "green", "black"])
    crop = image_ref(448, 448, 999)
    rows = []
    for b in args.batches if "latency" in args.parts else []:
        judge, draft, step = (
            list(x)
            for x in zip(
                *(phase_messages(small, large, images[i], crop, q) for i in range(b)), strict=True
            )
        )
        t_judge = measure(large, judge, args.reps, max_tokens=10)
        t_draft = measure(small, draft, args.reps, max_tokens=20, top_logprobs=64)
        t_step = measure(large, step, args.reps, max_tokens=args.agent_tokens)
        rows.append((b, t_judge, t_draft, t_step))
        print(
            f"batch {b:>3}: judge {t_judge * 1000:8.1f} ms   speculation {t_draft * 1000:8.1f} ms   "
            f"agent step ({args.agent_tokens} tok) {t_step * 1000:8.1f} ms   "
            f"(per query: {t_judge / b * 1000:.1f} / {t_draft / b * 1000:.1f} / {t_step / b * 1000:.1f} ms)"
        )
    if {"ceiling", "speculation"} & set(args.parts):
        for m in (small, large):
            m.scheduler.max_batch_size = args.batch
        large.max_new_tokens = args.agent_tokens
        graph_parts(small, large, args)
    if "resolution" in args.parts:
        resolution_part(small, large, args)
    if device == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
