"""Batches within a token budget, out-of-memory recovery, and bf16 gate decisions."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import write_scene
from langchain_core.messages import HumanMessage

from speceyes_graph.models import BatchScheduler, ChatTransformersVLM
from speceyes_graph.models.batching import BatchOutOfMemory
from speceyes_graph.models.memory import (
    CPU_BATCH_TOKENS,
    TokenBudget,
    bytes_per_token,
    default_batch_tokens,
    is_out_of_memory,
)


def padded(keys, payloads):  # payloads are prompt lengths; keys are max_new_tokens
    return len(payloads) * (max(payloads) + max(keys))


def test_batches_stay_within_the_token_budget_and_a_large_request_runs_alone():
    log = []
    hold = threading.Event()

    def run(key, payloads):
        hold.wait(5)  # let the queue fill before the first batch is formed
        log.append((key, list(payloads)))
        return [p * 2 for p in payloads]

    sched = BatchScheduler(
        run, max_batch_size=16, max_wait_s=0.02, batch_tokens=lambda k, p: padded(k, p),
        budget=TokenBudget(400),
    )  # fmt: skip
    sizes = [90, 10, 40, 500, 20, 150, 30, 90, 10, 60, 380, 5]
    futures = sched.submit_many(10, sizes)
    hold.set()
    assert [f.result(timeout=10) for f in futures] == [2 * s for s in sizes]
    for key, batch in log:
        assert len(batch) == 1 or padded([key] * len(batch), batch) <= 400, batch
    assert [500] in [b for _, b in log]  # over the budget: alone
    assert len(log) < len(sizes)  # the others still batched
    assert sched.stats.max_tokens == 510
    sched.close()


def test_out_of_memory_splits_the_batch_in_halves_and_lowers_the_budget():
    """A batch over the memory the fake device has is split, then split again; the budget
    drops to the halves, so the next batches are formed small enough from the start;
    requests that do not fit alone fail alone, saying so; other failures are unchanged."""
    log = []
    capacity = 100  # padded tokens the "device" holds

    def run(key, payloads):
        tokens = padded([key] * len(payloads), payloads)
        log.append((len(payloads), tokens))
        if tokens > capacity:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {tokens} tokens")
        return [ValueError("bad") if p == 13 else p + 1 for p in payloads]

    sched = BatchScheduler(
        run, max_batch_size=16, max_wait_s=0.02, batch_tokens=lambda k, p: padded(k, p),
        budget=TokenBudget(1000),
    )  # fmt: skip
    payloads = [20] * 6 + [13] + [20] * 5
    results = []
    for f in sched.submit_many(10, payloads):
        try:
            results.append(f.result(timeout=10))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)
    assert results[:6] + results[7:] == [21] * 11
    assert isinstance(results[6], ValueError)  # its own failure, not memory
    # whole, a half, its halves, then the other half split by the lowered budget, untried
    assert log == [(12, 360), (6, 180), (3, 90), (3, 90), (3, 90), (3, 90)]
    stats = sched.stats
    assert stats.out_of_memory == 2 and stats.split == 2
    assert stats.budget_cuts == [(1000, 180), (180, 90)] and stats.max_batch_tokens == 90
    # the next wave is formed within the lowered budget: no more out-of-memory errors
    log.clear()
    again = sched.submit_many(10, [20] * 8)
    assert [f.result(timeout=10) for f in again] == [21] * 8
    assert log and all(tokens <= 90 for _, tokens in log)
    assert sched.stats.out_of_memory == 2
    # a request that does not fit alone fails alone, saying so and naming the budget
    with pytest.raises(
        BatchOutOfMemory, match="does not fit on its own.*max_batch_tokens is now 90"
    ):
        sched.call(10, 300)
    assert sched.call(10, 20) == 21
    sched.close()


def test_a_derived_budget_is_computed_when_first_needed():
    calls = []
    budget = TokenBudget(None, derive=lambda: calls.append(1) or 1000)
    assert calls == [] and budget.limit is None  # not at construction
    assert budget.fits(1000) and not budget.fits(1001) and calls == [1]
    late = TokenBudget(None, derive=lambda: 1000)
    late.cut(800, rows=1)  # a first batch that ran out before anything was counted
    assert late.limit == 799 and late.fits(799) and late.cuts == [(1000, 799)]


def test_what_counts_as_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
    )
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocator's error


def test_the_default_budget_on_cpu_and_from_free_gpu_memory(monkeypatch):
    cpu = SimpleNamespace(device=torch.device("cpu"))
    assert default_batch_tokens(cpu) == CPU_BATCH_TOKENS
    assert ChatTransformersVLM.model_fields["max_batch_tokens"].default == "auto"
    config = SimpleNamespace(  # Qwen2.5-VL-7B's decoder
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4,
    )  # fmt: skip
    per_token = bytes_per_token(SimpleNamespace(text_config=config), 2)
    kv_cache = 2 * 28 * 4 * 128 * 2  # K and V, 28 layers, 4 KV heads of 128, bf16
    assert kv_cache == 57_344 and per_token > kv_cache
    gpu = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, config=config)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * 2**30, 141 * 2**30))
    budget = default_batch_tokens(gpu)
    assert budget == int(0.5 * 100 * 2**30 / per_token)
    assert 8 * 16_384 < budget < 100 * 2**30 // kv_cache  # eight paper-size images at once


def ask(path, text="What colour is the box?"):
    return [
        HumanMessage(
            content=[
                {"type": "image_url", "image_url": {"url": Path(path).as_uri()}},
                {"type": "text", "text": text},
            ]
        )
    ]


def test_local_batches_of_mixed_image_sizes_stay_within_the_budget(tiny_models, tmp_path):
    """Counted from the processor's grid before the call, every generate call's padded
    tokens stay within max_batch_tokens (a request larger than it runs alone), and the
    replies are those of unbatched calls."""
    budget = 300
    model = ChatTransformersVLM(
        model=str(tiny_models["large"]), max_new_tokens=12, max_batch_tokens=budget
    )
    sides = [64, 160, 448, 1000, 96, 300, 224, 700]
    requests = [ask(write_scene(tmp_path / f"s{i}.png", size=(s, s), box=(5, 5, s // 2, s // 2)))
                for i, s in enumerate(sides)]  # fmt: skip
    requests.append(ask(tmp_path / "s0.png", "Describe every colour you see. " * 40))
    alone = [model.invoke(r) for r in requests]
    calls = []
    generate = model.hf_model.generate

    def counted(**kwargs):
        rows, prompt = kwargs["input_ids"].shape
        calls.append((rows, rows * (prompt + kwargs["max_new_tokens"])))
        return generate(**kwargs)

    model.hf_model.generate = counted
    try:
        batched = model.batch(requests)
    finally:
        del model.hf_model.generate
    prompt_tokens = [m.usage_metadata["input_tokens"] for m in alone]
    assert max(prompt_tokens) + 12 > budget  # the long question alone is over the budget
    assert min(prompt_tokens) * 2 + 24 <= budget  # and small ones can share a call
    assert len(calls) < len(requests)
    assert all(tokens <= budget or rows == 1 for rows, tokens in calls), calls
    assert (1, max(prompt_tokens) + 12) in calls  # over the budget: alone
    assert [m.content for m in batched] == [m.content for m in alone]
    assert [m.usage_metadata for m in batched] == [m.usage_metadata for m in alone]


def test_memory_capped_process_splits_batches_and_fails_only_what_cannot_fit(tmp_path):
    """On the CPU, with the address space capped: a batch of sixteen that does not fit is
    split until it does (the replies equal unbatched ones), the budget goes down, and a
    request whose image alone does not fit fails alone with a message naming its size."""
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",  # freed blocks go back to the system
        "MALLOC_ARENA_MAX": "2",  # each thread's malloc arena reserves 64 MB of address space
        "OMP_NUM_THREADS": "1",  # no OpenMP pool threads created under the cap
    }
    script = Path(__file__).with_name("memory_capped.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "1350"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["batched"] == report["alone"]
    assert report["sizes"]["16"] == 1  # one batch of sixteen was tried first
    assert report["split"] >= 1 and report["out_of_memory"] >= 2
    cuts = report["budget_cuts"]
    assert cuts and cuts[0][0] is None and report["max_batch_tokens"] == cuts[-1][1]
    error = report["huge_error"]
    assert error and error.startswith("BatchOutOfMemory: out of memory generating 1 request")
    assert "1596x1596 px as the model sees it" in error  # the image size
    assert f"max_batch_tokens is now {report['max_batch_tokens']:,}" in error  # the budget


def test_bf16_gate_decisions_match_float32(tmp_path):
    """The demo speculator in bf16 and in float32 on 120 queries: the gate's log-probs are
    float32 from the logits either way; decisions may differ only within 1e-3 of tau."""
    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.demo.engines import DEMO_DRAFT_TOKENS
    from speceyes_graph.demo.run import demo_graph, demo_queries

    queries = [
        {"question": q.question, "images": [q.image], "options": q.options}
        for q in demo_queries(tmp_path, 120, seed=7)
    ]
    scores = {}
    for dtype in ("float32", "bfloat16"):
        small = ChatTransformersVLM(
            model=str(demo_checkpoints()["small"]), top_logprobs=64,
            max_new_tokens=DEMO_DRAFT_TOKENS, dtype=dtype,
        )  # fmt: skip
        assert small.hf_model.dtype == getattr(torch, dtype)
        outs = demo_graph(small, None, mode="small").compile().batch(queries)
        scores[dtype] = np.array([o["draft"]["score"] for o in outs], dtype=np.float64)
    fp32, bf16 = scores["float32"], scores["bfloat16"]
    report = {"max |diff|": float(np.abs(fp32 - bf16).max())}
    for tau in (0.95, 0.98):
        differ = (fp32 >= tau) != (bf16 >= tau)
        near = np.minimum(np.abs(fp32 - tau), np.abs(bf16 - tau)) < 1e-3
        report[tau] = (int(differ.sum()), int((differ & ~near).sum()))
        assert (fp32 >= tau).any() and (fp32 < tau).any()  # tau splits these queries
    print("bf16 vs float32 gate:", report)
    assert report[0.95][1] == 0 and report[0.98][1] == 0, report


def test_the_gpu_benchmark_resolution_part_runs_at_tiny_scale():
    """``scripts/bench_gpu.py --parts resolution`` on the CPU: every phase, both budgets."""
    script = Path(__file__).parents[1] / "scripts" / "bench_gpu.py"
    done = subprocess.run(
        [sys.executable, str(script), "--scale", "tiny", "--parts", "resolution", "--reps", "1",
         "--megapixels", "4", "--res-batches", "1", "4", "--budget", "1500"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if " MP (" in line]
    assert len(rows) == 4  # batch 1 and 4, budget on and off
    assert all(line.count("fits") == 3 for line in rows), rows
    on4 = next(r for r in rows if "batch  4 budget on" in r)
    off4 = next(r for r in rows if "batch  4 budget off" in r)
    step_calls = [float(r.split("| step")[1].split("calls")[0].split()[-1]) for r in (on4, off4)]
    assert step_calls[0] > 1 and step_calls[1] == 1  # the budget splits the agent steps


def test_specs_and_the_cli_pass_the_budget_on(tiny_models):
    from speceyes_graph.cli.bench import _batch_tokens
    from speceyes_graph.models.specs import ModelSpec, load_chat_model

    assert [_batch_tokens(v) for v in ("auto", "None", "4000")] == ["auto", None, 4000]
    model = load_chat_model(
        ModelSpec("path", str(tiny_models["large"])), top_logprobs=None, max_new_tokens=4,
        batch_size=4, max_batch_tokens=4000,
    )  # fmt: skip
    assert model.scheduler.budget.limit == 4000 and model.scheduler.max_batch_size == 4


def test_bench_prints_how_each_model_batched_and_any_memory_trouble():
    from speceyes_graph.cli.bench import _batching_lines
    from speceyes_graph.models import BatchStats

    stats = BatchStats(calls=3, requests=6, out_of_memory=1, split=1, max_tokens=900)
    stats.max_batch_tokens = 450
    served = SimpleNamespace()  # no scheduler: batches on its server
    lines = _batching_lines(
        {"small": served, "large": SimpleNamespace(scheduler=SimpleNamespace(stats=stats))}
    )
    assert lines == [
        "large: 3 generate calls, mean batch 2.0, largest 900 padded tokens; "
        "1 ran out of memory (1 split), max_batch_tokens now 450"
    ]
