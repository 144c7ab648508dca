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
  tau at the median draft score; agent loops of ``--steps`` steps), side by side.

Random weights rarely emit EOS, so every call generates its full length.

On a GPU: python3 scripts/bench_gpu.py
On a CPU, to check the script itself:
    python3 scripts/bench_gpu.py --scale tiny --batches 1 2 --n 8 --reps 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from langchain_core.messages import AIMessage, SystemMessage

from speceyes_graph import GateConfig, create_speceyes_graph
from speceyes_graph.benchmarks.throughput import (
    FixedDecisionJudge,
    ceiling,
    compare_speculation,
    speculation_report,
)
from speceyes_graph.demo.tiny import _processor, build_qwen_vl, build_tokenizer
from speceyes_graph.messages import user_message
from speceyes_graph.models import ChatTransformersVLM
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
                    max_agent_steps=args.steps,
                    speculation=speculation,
                )

            results = compare_speculation(
                make_graph, queries, {"small": small, "large": large}, reps=max(1, args.reps - 1)
            )
            print(
                f"mixed workload, {len(queries)} queries, agent steps <= {args.steps} of {args.agent_tokens} tokens:"
            )
            print(speculation_report(results))


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
        choices=["latency", "ceiling", "speculation"],
        default=["latency", "ceiling", "speculation"],
    )
    parser.add_argument("--n", type=int, default=64, help="queries for ceiling and speculation")
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size for those parts")
    parser.add_argument("--steps", type=int, default=2, help="agent loop steps (speculation)")
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
        judge = [
            [
                SystemMessage(content=JUDGE_SYSTEM_PROMPT),
                user_message([images[i]], q + JUDGE_USER_SUFFIX, large.resize_spec),
            ]
            for i in range(b)
        ]
        draft = [
            [
                SystemMessage(content=SPECULATOR_SYSTEM_PROMPT),
                user_message([images[i]], q + "\nAnswer:", small.resize_spec),
            ]
            for i in range(b)
        ]
        step = [
            [
                SystemMessage(content=DEEPEYES_SYSTEM_PROMPT),
                user_message([images[i]], q + DEEPEYES_USER_PROMPT, large.resize_spec),
                AIMessage(
                    content='<think>zoom</think><tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 10, 200, 200]}}</tool_call>'
                ),
                user_message([crop], DEEPEYES_USER_PROMPT, large.resize_spec),
            ]
            for i in range(b)
        ]
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
    if device == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
