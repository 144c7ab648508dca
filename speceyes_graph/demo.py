"""``speceyes demo``: the method working end to end on the embedded checkpoints, offline.

Loads the two shipped checkpoints (package data, trained by ``speceyes train-demo`` on the
simplified synthetic world of :mod:`.training`), builds a fixed set of held-out queries,
and runs three configurations side by side on this machine with cross-query batching:
agent only (the baseline), SpecEyes, and drafts only (for the gate's statistics). It
prints the comparison table and one example per route, and writes the workflow picture,
the report (Markdown, JSON, plots) and the per-query records to the output folder.
"""

from __future__ import annotations

import json
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .agent import LoopOptions
from .benchmarks.datasets import BenchQuery
from .benchmarks.report import write_report
from .benchmarks.runner import read_records, run_benchmark
from .drawing import draw
from .graph import create_speceyes_graph
from .separability import GateConfig
from .training import DEMO_PROMPTS, QUESTION, make_scene

__all__ = [
    "DEMO_GRAPH_SETTINGS",
    "demo_checkpoints",
    "demo_graph",
    "demo_models",
    "demo_queries",
    "fixed_routes",
    "run_demo",
]

EVAL_SEED = 20_251_130  # far from the training seeds


def demo_checkpoints() -> dict[str, Path]:
    """Paths of the shipped demo checkpoints (inside the installed package)."""
    root = Path(str(files("speceyes_graph") / "demo_models"))
    paths = {"small": root / "small", "large": root / "large"}
    missing = [k for k, p in paths.items() if not (p / "config.json").exists()]
    if missing:
        raise FileNotFoundError(
            f"demo checkpoints missing ({missing}) under {root}; build them with `speceyes train-demo`"
        )
    return paths


def demo_queries(
    folder: Path, n: int = 60, small_share: float = 0.25, seed: int = EVAL_SEED
) -> list[BenchQuery]:
    """Held-out scenes written as PNG files, with their expected option letters."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_small = int(round(n * small_share))
    flags = np.array([True] * n_small + [False] * (n - n_small))
    rng.shuffle(flags)
    queries = []
    for i, small in enumerate(flags):
        scene = make_scene(rng, bool(small))
        path = folder / f"q{i:03d}.png"
        if not path.exists():
            Image.fromarray(scene.image).save(path, compress_level=1)
        letter = "ABCD"[scene.options.index(scene.colour)]
        meta = {"needs_zoom": bool(small), "bbox": list(scene.box), "answer_text": scene.colour}
        queries.append(
            BenchQuery(
                f"q{i:03d}",
                QUESTION,
                letter,
                "small-object" if small else "large-object",
                scene.options,
                image=str(path),
                meta=meta,
            )
        )
    return queries


def demo_models(batch_size: int = 16, paths: dict[str, Path] | None = None) -> dict[str, Any]:
    """The shipped checkpoints as chat models, with the demo's generation settings."""
    from .models import ChatTransformersVLM

    paths = paths or demo_checkpoints()
    return {
        "small": ChatTransformersVLM(
            model=str(paths["small"]), top_logprobs=64, max_new_tokens=8, max_batch_size=batch_size
        ),
        "large": ChatTransformersVLM(
            model=str(paths["large"]), max_new_tokens=96, max_batch_size=batch_size
        ),
    }


DEMO_GRAPH_SETTINGS: dict[str, Any] = {
    "prompts": DEMO_PROMPTS,  # the prompts the demo checkpoints were trained on
    "gate": GateConfig(),  # the published gate
    "max_agent_steps": 4,
    # trained with the tool's text line in each <tool_response>, and corrective messages
    "loop": LoopOptions(tool_response_text=True, explain_problems=True),
}


def demo_graph(small: Any = None, large: Any = None, mode: str = "speceyes") -> Any:
    """The uncompiled demo graph (demo prompts, published gate, at most 4 agent steps)."""
    return create_speceyes_graph(speculator=small, agent=large, mode=mode, **DEMO_GRAPH_SETTINGS)


def fixed_routes(models: dict[str, Any], folder: Path, n: int, seed: int) -> list[dict[str, Any]]:
    """Route and answer of each of ``n`` fixed queries (what the golden test replays)."""
    queries = demo_queries(folder, n, seed=seed)
    graph = demo_graph(models["small"], models["large"]).compile()
    outs = graph.batch(
        [{"question": q.question, "images": [q.image], "options": q.options} for q in queries],
        {"max_concurrency": 16},
    )
    return [
        {"id": q.id, "route": o["route"], "answer": o["answer"]}
        for q, o in zip(queries, outs, strict=True)
    ]


def _graphs(paths: dict[str, Path], batch_size: int) -> dict[str, Any]:
    models = demo_models(batch_size, paths)
    small, large = models["small"], models["large"]
    return {
        "agent": demo_graph(large=large, mode="agent"),
        "speceyes": demo_graph(small, large),
        "small": demo_graph(small, mode="small"),
    }


def run_demo(
    out_dir: str | Path = "speceyes-demo",
    n: int = 60,
    *,
    batch_size: int = 16,
    checkpoints: dict[str, Path] | None = None,
    print_fn=print,
) -> dict[str, Any]:
    """Run the side-by-side comparison and write everything under ``out_dir``."""
    out = Path(out_dir)
    paths = checkpoints or demo_checkpoints()
    queries = demo_queries(out / "scenes", n)
    graphs = _graphs(paths, batch_size)
    (out / "workflow.png").parent.mkdir(parents=True, exist_ok=True)
    (out / "workflow.png").write_bytes(draw(graphs["speceyes"], "png"))
    walls = {}
    for mode in ("agent", "speceyes", "small"):
        run_dir = out / f"run-{mode}"
        for f in ("records.jsonl", "run.json"):  # a demo is a fresh measurement every time
            (run_dir / f).unlink(missing_ok=True)
        t0 = time.perf_counter()
        run_benchmark(
            graphs[mode].compile(),
            queries,
            run_dir,
            mode=mode,
            concurrency=2 * batch_size,
            progress=False,
        )
        walls[mode] = time.perf_counter() - t0
    report = write_report(out / "run-speceyes", out / "run-agent")
    small_report = write_report(out / "run-small", out / "run-agent", out / "gate")
    summary = _print_summary(out, report, small_report, walls, print_fn)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _split_accuracy(records: list[dict], split: str) -> float | None:
    rs = [r for r in records if r["split"] == split]
    return sum(r["correct"] for r in rs) / len(rs) if rs else None


def _print_summary(
    out: Path, report: dict, small_report: dict, walls: dict[str, float], print_fn
) -> dict[str, Any]:
    records = {m: read_records(out / f"run-{m}") for m in ("agent", "speceyes", "small")}
    s, b = report["summary"], report["baseline"]["summary"]
    n = s["n"]
    speedup = walls["agent"] / walls["speceyes"]
    auroc = small_report["sweep"]["auroc"]
    summary = {
        "n": n,
        "agent_accuracy": b["accuracy"],
        "speceyes_accuracy": s["accuracy"],
        "small_accuracy": small_report["summary"]["accuracy"],
        "small_accuracy_large_objects": _split_accuracy(records["small"], "large-object"),
        "small_accuracy_small_objects": _split_accuracy(records["small"], "small-object"),
        "agent_wall_s": walls["agent"],
        "speceyes_wall_s": walls["speceyes"],
        "speedup": speedup,
        "agent_mean_latency_s": b["latency_mean_s"],
        "speceyes_mean_latency_s": s["latency_mean_s"],
        "beta": s["beta"],
        "alpha": s["alpha"],
        "ideal_speedup": s["ideal_speedup"],
        "routes": s["routes"],
        "auroc_separability": auroc["separability_min"],
        "auroc_softmax": auroc["softmax"],
        "errors": s["errors"] + b["errors"],
    }
    f = lambda v, spec=".3f": "-" if v is None else format(v, spec)  # noqa: E731
    print_fn(
        f"speceyes demo: {n} held-out synthetic queries, embedded demo checkpoints, this machine's CPU\n"
    )
    print_fn(f"{'':<22}{'accuracy':>10}{'wall s':>10}{'mean latency s':>16}")
    print_fn(
        f"{'agent only':<22}{f(b['accuracy']):>10}{walls['agent']:>10.2f}{f(b['latency_mean_s']):>16}"
    )
    print_fn(
        f"{'SpecEyes':<22}{f(s['accuracy']):>10}{walls['speceyes']:>10.2f}{f(s['latency_mean_s']):>16}"
    )
    print_fn(f"{'small model only':<22}{f(summary['small_accuracy']):>10}{walls['small']:>10.2f}")
    print_fn(
        f"\nspeedup {speedup:.2f}x  |  beta {f(s['beta'])}  alpha {f(s['alpha'])}  ideal 1/(1-beta*alpha) {f(s['ideal_speedup'], '.2f')}x"
    )
    print_fn("routes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["routes"].items())))
    print_fn(
        f"small model accuracy: large objects {f(summary['small_accuracy_large_objects'])}, small objects {f(summary['small_accuracy_small_objects'])}"
    )
    print_fn(
        f"gate AUROC for draft correctness: separability {f(auroc['separability_min'])}, softmax confidence {f(auroc['softmax'])}"
    )
    print_fn("\nexamples:")
    for route in ("speculative", "judged-agentic", "rejected-agentic"):
        r = next((r for r in records["speceyes"] if r["route"] == route), None)
        if r is None:
            print_fn(f"  {route:<17} (none in this run)")
            continue
        draft = r.get("draft") or {}
        score = (
            f"draft {draft.get('text')!r} score {draft['score']:.4f}"
            if draft.get("score") is not None
            else "no draft"
        )
        steps = len(r.get("agent_steps") or [])
        print_fn(
            f"  {route:<17} {r['id']} ({r['split']}): answer {r['answer']!r} (expected {r['meta']['answer_text']!r}), {score}, {steps} agent steps"
        )
    print_fn(
        f"\nwrote {out}/workflow.png, report.md and plots in {out}/run-speceyes and {out}/gate, records in {out}/run-*/records.jsonl"
    )
    return summary
