"""``speceyes demo``: the method working end to end on the embedded checkpoints, offline.

Loads the two shipped checkpoints (package data, trained by ``speceyes train-demo`` on the
demo world of :mod:`.world`), writes held-out scenes, and runs three configurations on
this machine with cross-query batching: agent only (the baseline), SpecEyes, and the small
model alone (which gives the gate's statistics). It prints a table that defines its
figures, and writes everything under the output folder, with a README that explains it:
the workflow picture, both reports with their plots, annotated example scenes and the
per-query records.
"""

from __future__ import annotations

import json
import time
from importlib.resources import files
from pathlib import Path
from typing import Any, cast

import numpy as np
from PIL import Image

from ..agents.loop import LoopOptions
from ..benchmarks.datasets import BenchQuery
from ..benchmarks.report import build_report, write_report
from ..benchmarks.runner import read_records, run_benchmark
from ..gate.online import LabelOptions, OnlineGate, TrustOptions, read_evidence
from ..gate.separability import GateConfig
from ..graph.build import create_speceyes_graph
from ..graph.drawing import draw
from ..graph.options import SpeculationOptions
from ..state import Mode
from .annotated import write_examples
from .engines import EngineName, demo_engine, local_models
from .summary import (
    MICRO_SPLIT,
    SPLITS,
    demo_summary,
    depth_summary,
    label,
    mode_row,
    online_summary,
    readme,
    summary_text,
)
from .world import DEMO_PROMPTS, make_scene

__all__ = [
    "DEMO_GRAPH_SETTINGS",
    "MICRO_SHARE",
    "ZOOM_SHARE",
    "demo_checkpoints",
    "demo_graph",
    "demo_models",
    "demo_queries",
    "fixed_routes",
    "run_demo",
]

EVAL_SEED = 20_251_130  # far from the training seeds
ZOOM_SHARE = 1 / 3  # a third of the demo's queries need the zoom tool
MICRO_SHARE = 0.15  # and of those, this share has a micro target only the large model reads


def demo_checkpoints() -> dict[str, Path]:
    """Paths of the shipped demo checkpoints (inside the installed package)."""
    root = Path(str(files("speceyes_graph") / "demo" / "checkpoints"))
    paths = {"small": root / "small", "large": root / "large"}
    missing = [k for k, p in paths.items() if not (p / "config.json").exists()]
    if missing:
        raise FileNotFoundError(
            f"demo checkpoints missing ({missing}) under {root}; build them with `speceyes train-demo`"
        )
    return paths


def demo_queries(
    folder: str | Path,
    n: int = 60,
    zoom_share: float = ZOOM_SHARE,
    seed: int = EVAL_SEED,
    progress: bool = False,
    micro_share: float = MICRO_SHARE,
) -> list[BenchQuery]:
    """Held-out scenes written as PNG files (kept if already there), with expected letters.

    ``micro_share`` of the zoom queries have a micro target (5-8 px): after one zoom the small
    model is near chance on them and the large agent, trained on them, is not, so they are
    the queries depth-1 speculation must hand back. They come from a generator of their own,
    and the scene each replaces is still drawn, so every other scene is the same at any share.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_tiny = int(round(n * zoom_share))
    flags = np.array([True] * n_tiny + [False] * (n - n_tiny))
    rng.shuffle(flags)
    micro_rng = np.random.default_rng([seed, 1])
    tiny_ids = np.flatnonzero(flags)
    micro_ids = set(
        micro_rng.choice(
            tiny_ids, size=int(round(len(tiny_ids) * micro_share)), replace=False
        ).tolist()
    )
    queries = []
    items = enumerate(flags)
    if progress:
        from ..progress import progress_bar

        items = progress_bar(items, total=n, desc="writing scenes", unit="scene")
    for i, tiny in items:
        scene = make_scene(rng, bool(tiny))
        if i in micro_ids:
            scene = make_scene(micro_rng, True, micro=True)
        path = folder / f"q{i:03d}.png"
        if not path.exists():
            Image.fromarray(scene.image).save(path, compress_level=1)
        meta = {
            "needs_zoom": bool(tiny),
            "micro": scene.micro,
            "bbox": list(scene.box),
            "region": scene.region_name,
            "answer_text": scene.colour,
        }
        queries.append(
            BenchQuery(
                f"q{i:03d}",
                scene.question,
                "ABCD"[scene.options.index(scene.colour)],
                MICRO_SPLIT if scene.micro else SPLITS[bool(tiny)],
                scene.options,
                image=str(path),
                meta=meta,
            )
        )
    return queries


def demo_models(batch_size: int = 16, paths: dict[str, Path] | None = None) -> dict[str, Any]:
    """The shipped checkpoints as local chat models, with the demo's generation settings."""
    return local_models(batch_size, paths or demo_checkpoints())


DEMO_GRAPH_SETTINGS: dict[str, Any] = {
    "prompts": DEMO_PROMPTS,  # the prompts the demo checkpoints were trained on
    # the published gate; depth-1 answers with tau_depth calibrated for these checkpoints on
    # 300 scenes the demo never evaluates on (scripts/calibrate_demo_depth.py: certified
    # 0.96304 at 1% accuracy loss, probability 0.9; rounded up, stricter)
    "gate": GateConfig(tau_depth=0.964),
    # at most 4 agent steps; trained with the tool's text line in each <tool_response>, and
    # corrective messages (depth-D speculation's small loop turns are as long as the agent's
    # by default: the large model's DEMO_TURN_TOKENS)
    "loop": LoopOptions(max_steps=4, tool_response_text=True, explain_problems=True),
}


def demo_graph(
    small: Any = None, large: Any = None, mode: Mode = "speceyes", speculation_depth: int = 0
) -> Any:
    """The uncompiled demo graph (demo prompts, published gate, at most 4 agent steps)."""
    return create_speceyes_graph(
        speculator=small,
        agent=large,
        mode=mode,
        speculation=SpeculationOptions(depth=speculation_depth),
        **DEMO_GRAPH_SETTINGS,
    )


DEMO_GATE_EVIDENCE = Path(__file__).parent / "gate_evidence.json"
"""300 labelled calibration queries of the shipped checkpoints, on scenes the demo never
evaluates on (``scripts/make_demo_gate_evidence.py``): the online gate's warm start."""


def demo_online_gate(max_risk: float = 0.05, shadow_rate: float | None = None) -> OnlineGate:
    """The demo's online gate, started as a deployment with a gate file would be: from 300
    labelled calibration queries (:data:`DEMO_GATE_EVIDENCE`), otherwise at the gate's
    defaults (its window keeps the seeds for a demo's few hundred queries, as it keeps a
    new deployment's; ``shadow_rate`` None: the gate's policy)."""
    return OnlineGate(
        max_risk,
        shadow_rate,
        config=DEMO_GRAPH_SETTINGS["gate"],
        evidence=read_evidence(DEMO_GATE_EVIDENCE),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(store=None),
    )


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


def run_demo(
    out_dir: str | Path = "speceyes-demo",
    n: int = 60,
    *,
    batch_size: int = 16,
    checkpoints: dict[str, Path] | None = None,
    progress: bool = True,
    print_fn=print,
    specreason: bool = False,
    engine: EngineName = "transformers",
    small_url: str | None = None,
    large_url: str | None = None,
    depth: int = 0,
    online: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    """Run the side-by-side comparison and write everything under ``out_dir``;
    ``specreason`` adds the SpecReason baseline (about as long again as the rest); ``depth``
    D > 0 adds SpecEyes with depth-D speculation (the small model zooms itself first);
    ``online`` (``{"max_risk": .., "shadow_rate": ..}``) adds SpecEyes with the online gate
    (:func:`demo_online_gate`), its path against agent only's answers in the summary.

    ``engine="vllm"`` runs the models behind vLLM servers instead of in this process: two
    started here for the shipped checkpoints (``bash scripts/setup-vllm.sh`` first), or the
    ones at ``small_url`` / ``large_url``."""
    t0 = time.perf_counter()
    paths = checkpoints or demo_checkpoints()
    with demo_engine(
        engine, paths, batch_size=batch_size, small_url=small_url, large_url=large_url,
        print_fn=print_fn,
    ) as running:  # fmt: skip
        summary = _run_modes(
            Path(out_dir), n, running.models, batch_size, progress, print_fn, specreason, depth,
            online,
        )  # fmt: skip
    summary["engine"] = {"name": running.name, "description": running.description,
                         "setup_s": running.setup_s}  # fmt: skip
    return _write_summary(Path(out_dir), summary, t0, print_fn)


def _run_modes(
    out: Path,
    n: int,
    models: dict[str, Any],
    batch_size: int,
    progress: bool,
    print_fn,
    specreason: bool,
    depth: int = 0,
    online: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    print_fn(f"speceyes demo: the embedded checkpoints, {n} held-out scenes")
    queries = demo_queries(out / "scenes", n, progress=progress)
    graphs = {
        "agent": demo_graph(large=models["large"], mode="agent"),
        "speceyes": demo_graph(models["small"], models["large"]),
        "small": demo_graph(models["small"], mode="small"),
    }
    modes = ["agent", "speceyes", "small"]
    if depth:
        graphs["depth"] = demo_graph(models["small"], models["large"], speculation_depth=depth)
        modes.insert(2, "depth")
    if specreason:
        graphs["specreason"] = demo_graph(models["small"], models["large"], mode="specreason")
        modes.append("specreason")
    online_gate, shadow_tail_s = None, 0.0
    if online:
        max_risk, shadow_rate = online.get("max_risk"), online.get("shadow_rate")
        online_gate = demo_online_gate(0.05 if max_risk is None else max_risk, shadow_rate)
        settings = {k: v for k, v in DEMO_GRAPH_SETTINGS.items() if k != "gate"}
        graphs["online"] = create_speceyes_graph(
            speculator=models["small"], agent=models["large"], gate=online_gate, **settings
        )
        modes.insert(modes.index("speceyes") + 1, "online")
    (out / "workflow.png").write_bytes(cast(bytes, draw(graphs["speceyes"], "png")))  # PNG: bytes
    # enough queries in flight that the agent's batches fill while the judge and drafts take
    # their turns (the same for every mode)
    concurrency = 4 * batch_size
    for mode in modes:
        run_dir = out / f"run-{mode}"
        for f in ("records.jsonl", "run.json"):  # a demo is a fresh measurement every time
            (run_dir / f).unlink(missing_ok=True)
        run_benchmark(
            graphs[mode].compile(),
            queries,
            run_dir,
            mode=mode,
            concurrency=concurrency,
            progress=progress,
            total=n,
            desc=f"{label(mode, depth):<16}",
            settings={
                **_recorded_settings(batch_size, concurrency),
                "speculation_depth": depth if mode == "depth" else 0,
                **(online if mode == "online" and online else {}),
            },
        )
        if mode == "online" and online_gate is not None:
            t_tail = time.perf_counter()  # the shadow runs still verifying: their cost too
            online_gate.shadows.drain(timeout=600)
            shadow_tail_s = time.perf_counter() - t_tail
    report = write_report(
        out / "run-speceyes",
        out / "run-agent",
        title="SpecEyes against the agent-only baseline",
        compare=[
            out / f"run-{m}" for m in modes if m not in ("agent", "speceyes", "depth", "online")
        ],
    )
    gate = write_report(
        out / "run-small",
        out / "run-agent",
        out / "gate",
        title="The gate: the small model's draft on every query, scored by its separability",
    )
    records = {m: read_records(out / f"run-{m}") for m in modes}
    summary = demo_summary(report, gate, records)
    if specreason:
        sr = build_report(out / "run-specreason", out / "run-agent")["summary"]
        summary["rows"]["specreason"] = mode_row(sr, records["specreason"])
        steps = [st for r in records["specreason"] for st in r.get("agent_steps") or []]
        summary["specreason"] = {
            "speedup_wall": sr.get("speedup_wall"),
            "steps": len(steps),
            "accepted": sum(bool(st.get("accepted")) for st in steps),
        }
    if depth:
        summary.update(depth_summary(out, records, depth, summary))
    if online_gate is not None:
        online_report = write_report(
            out / "run-online", out / "run-agent", title="SpecEyes with the online gate"
        )
        summary.update(
            online_summary(
                online_report, records["online"], online_gate.state(), summary, shadow_tail_s
            )
        )
    summary["examples"] = write_examples(out / "examples", queries, records)
    return summary


def _write_summary(out: Path, summary: dict[str, Any], t0: float, print_fn) -> dict[str, Any]:
    summary["total_s"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = summary_text(summary)
    (out / "README.md").write_text(readme(summary, text))
    print_fn("\n" + text)
    print_fn(
        f"\nwrote {out}/README.md (what everything means), workflow.png, examples/*.png, "
        f"run-speceyes/report.md, gate/report.md and the plots beside them, "
        f"records in run-*/records.jsonl ({summary['total_s']:.0f} s in all)"
    )
    return summary


def _recorded_settings(batch_size: int, concurrency: int) -> dict[str, Any]:
    """What run.json records, as ``speceyes bench`` does (the report reads the gate from it)."""
    gate = DEMO_GRAPH_SETTINGS["gate"]
    return {
        "threshold": gate.tau,
        "tau_depth": gate.tau_depth,
        "aggregation": gate.aggregation,
        "top_k": gate.k,
        "max_agent_steps": DEMO_GRAPH_SETTINGS["loop"].max_steps,
        "batch_size": batch_size,
        "concurrency": concurrency,
        "small": "demo",
        "large": "demo",
    }
