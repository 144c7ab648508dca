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
import textwrap
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from speceyes_tools.images import load_image

from ..agent import LoopOptions
from ..benchmarks.datasets import BenchQuery
from ..benchmarks.report import DEFINITIONS, build_report, write_report
from ..benchmarks.runner import read_records, run_benchmark
from ..drawing import draw
from ..graph import create_speceyes_graph
from ..separability import DEFAULT_ALPHA, GateConfig
from .engines import EngineName, demo_engine, local_models
from .world import DEMO_PROMPTS, make_scene

__all__ = [
    "DEMO_GRAPH_SETTINGS",
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
SPLITS = {True: "needs-zoom", False: "no-zoom"}
LABELS = {
    "agent": "agent only",
    "speceyes": "SpecEyes",
    "small": "small model only",
    "specreason": "SpecReason",
}
ROUTE_WORDS = {
    "speculative": "judge: no tools needed; draft accepted by the gate",
    "judged-agentic": "judge: tools needed; agent loop",
    "rejected-agentic": "judge: no tools needed; draft rejected by the gate; agent loop",
}


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
    folder: Path,
    n: int = 60,
    zoom_share: float = ZOOM_SHARE,
    seed: int = EVAL_SEED,
    progress: bool = False,
) -> list[BenchQuery]:
    """Held-out scenes written as PNG files (kept if already there), with expected letters."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_tiny = int(round(n * zoom_share))
    flags = np.array([True] * n_tiny + [False] * (n - n_tiny))
    rng.shuffle(flags)
    queries = []
    items = enumerate(flags)
    if progress:
        from ..progress import progress_bar

        items = progress_bar(items, total=n, desc="writing scenes", unit="scene")
    for i, tiny in items:
        scene = make_scene(rng, bool(tiny))
        path = folder / f"q{i:03d}.png"
        if not path.exists():
            Image.fromarray(scene.image).save(path, compress_level=1)
        meta = {
            "needs_zoom": bool(tiny),
            "bbox": list(scene.box),
            "region": scene.region_name,
            "answer_text": scene.colour,
        }
        queries.append(
            BenchQuery(
                f"q{i:03d}",
                scene.question,
                "ABCD"[scene.options.index(scene.colour)],
                SPLITS[bool(tiny)],
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
) -> dict[str, Any]:
    """Run the side-by-side comparison and write everything under ``out_dir``;
    ``specreason`` adds the SpecReason baseline (about as long again as the rest).

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
            Path(out_dir), n, running.models, batch_size, progress, print_fn, specreason
        )
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
    if specreason:
        graphs["specreason"] = demo_graph(models["small"], models["large"], mode="specreason")
        modes.append("specreason")
    (out / "workflow.png").write_bytes(draw(graphs["speceyes"], "png"))
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
            desc=f"{LABELS[mode]:<16}",
            settings=_recorded_settings(batch_size, concurrency),
        )
    report = write_report(
        out / "run-speceyes",
        out / "run-agent",
        title="SpecEyes against the agent-only baseline",
        compare=[out / f"run-{m}" for m in modes if m not in ("agent", "speceyes")],
    )
    gate = write_report(
        out / "run-small",
        out / "run-agent",
        out / "gate",
        title="The gate: the small model's draft on every query, scored by its separability",
    )
    records = {m: read_records(out / f"run-{m}") for m in modes}
    summary = _summary(report, gate, records)
    if specreason:
        sr = build_report(out / "run-specreason", out / "run-agent")["summary"]
        summary["rows"]["specreason"] = {
            "accuracy": sr["accuracy"],
            "needs_zoom": _split_accuracy(records["specreason"], SPLITS[True]),
            "no_zoom": _split_accuracy(records["specreason"], SPLITS[False]),
            "wall_s": sr["wall_s"],
            "latency_mean_s": sr["latency_mean_s"],
            "errors": sr["errors"],
        }
        steps = [st for r in records["specreason"] for st in r.get("agent_steps") or []]
        summary["specreason"] = {
            "speedup_wall": sr.get("speedup_wall"),
            "steps": len(steps),
            "accepted": sum(bool(st.get("accepted")) for st in steps),
        }
    summary["examples"] = write_examples(out / "examples", queries, records)
    return summary


def _write_summary(out: Path, summary: dict[str, Any], t0: float, print_fn) -> dict[str, Any]:
    summary["total_s"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = summary_text(summary)
    (out / "README.md").write_text(_readme(summary, text))
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
        "aggregation": gate.aggregation,
        "top_k": gate.k,
        "max_agent_steps": DEMO_GRAPH_SETTINGS.get("max_agent_steps"),
        "batch_size": batch_size,
        "concurrency": concurrency,
        "small": "demo",
        "large": "demo",
    }


# --- the summary: one number per definition ------------------------------------------------------


def _split_accuracy(records: list[dict], split: str) -> float | None:
    rs = [r for r in records if r["split"] == split]
    return sum(r["correct"] for r in rs) / len(rs) if rs else None


def _summary(report: dict, gate: dict, records: dict[str, list[dict]]) -> dict[str, Any]:
    s, b = report["summary"], report["baseline"]["summary"]
    small = gate["summary"]
    tau = s["tau"]
    rows = {}
    for mode, summ in (("agent", b), ("speceyes", s), ("small", small)):
        rows[mode] = {
            "accuracy": summ["accuracy"],
            "needs_zoom": _split_accuracy(records[mode], SPLITS[True]),
            "no_zoom": _split_accuracy(records[mode], SPLITS[False]),
            "wall_s": summ["wall_s"],
            "latency_mean_s": summ["latency_mean_s"],
            "errors": summ["errors"],
        }
    ideal, wall = s.get("ideal_speedup"), s.get("speedup_wall")
    return {
        "n": s["n"],
        "n_needs_zoom": sum(r["split"] == SPLITS[True] for r in records["speceyes"]),
        "rows": rows,
        "speedup_wall": wall,
        "speedup_latency": s.get("speedup_latency"),
        "ideal_speedup": ideal,
        "share_of_ideal": wall / ideal if wall and ideal else None,
        "speedup_modelled": s.get("speedup_modelled"),
        "beta": s["beta"],
        "alpha": s["alpha"],
        "tau": tau,
        "tau_separability": float(np.log(tau / (1 - tau)) / DEFAULT_ALPHA),
        "routes": s["routes"],
        "auroc_separability": gate["sweep"]["auroc"]["separability_min"],
        "auroc_softmax": gate["sweep"]["auroc"]["softmax"],
        "errors": sum(row["errors"] for row in rows.values()),
        "definitions": {k: DEFINITIONS[k] for k in DEMO_DEFINED},
    }


DEMO_DEFINED = (
    "beta",
    "alpha",
    "tau",
    "separability",
    "speedup_wall",
    "speedup_latency",
    "ideal_speedup",
    "speedup_modelled",
    "auroc",
)


def _f(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def summary_text(summary: dict[str, Any]) -> str:
    """The printed table: every figure with its definition, one line each."""
    rows, n = summary["rows"], summary["n"]
    lines = [
        f"{n} held-out demo queries ({summary['n_needs_zoom']} need zooming: tiny objects), "
        "embedded demo checkpoints, this machine",
        f"engine: {(summary.get('engine') or {}).get('description', 'transformers')}",
        "",
        f"{'':<18}{'accuracy':>9}{'needs zoom':>12}{'no zoom':>9}{'wall s':>9}{'mean latency s':>16}",
    ]
    for mode, row in rows.items():
        lines.append(
            f"{LABELS[mode]:<18}{_f(row['accuracy']):>9}{_f(row['needs_zoom']):>12}"
            f"{_f(row['no_zoom']):>9}{_f(row['wall_s'], '.1f'):>9}{_f(row['latency_mean_s'], '.2f'):>16}"
        )
    d = summary["definitions"]
    share = summary["share_of_ideal"]
    figures = [
        ("speedup_wall", f"{_f(summary['speedup_wall'], '.2f')}x", d["speedup_wall"]),
        (
            "ideal_speedup",
            f"{_f(summary['ideal_speedup'], '.2f')}x",
            d["ideal_speedup"] + (f" (measured/ideal = {share:.2f})" if share else ""),
        ),
        ("speedup_latency", f"{_f(summary['speedup_latency'], '.2f')}x", d["speedup_latency"]),
        ("speedup_modelled", f"{_f(summary['speedup_modelled'], '.2f')}x", d["speedup_modelled"]),
        ("beta", _f(summary["beta"]), d["beta"]),
        ("alpha", _f(summary["alpha"]), d["alpha"]),
        (
            "tau",
            f"{summary['tau']:g}",
            d["tau"] + f" (= separability {summary['tau_separability']:.2f})",
        ),
        ("separability", "", d["separability"]),
        (
            "auroc",
            _f(summary["auroc_separability"]),
            d["auroc"] + f" (softmax confidence: {_f(summary['auroc_softmax'])})",
        ),
    ]
    lines.append("")
    for name, value, meaning in figures:
        lines.append(f"{name:<17}{value:>7}  {meaning}")
    if summary.get("specreason"):
        sr = summary["specreason"]
        lines.append(
            f"\nSpecReason: {_f(sr['speedup_wall'], '.2f')}x the agent's throughput; the large "
            f"model kept {sr['accepted']} of {sr['steps']} drafted steps (the demo agent was never "
            "trained to score steps 0-9: most of its replies hold no digit, which counts as 0)"
        )
    lines.append(
        "\nroutes (SpecEyes): "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary["routes"].items()))
    )
    for ex in summary.get("examples", []):
        lines.append(
            f"example {ex['route']:<17} {ex['id']}: {ex['question']!r} -> {ex['answer']!r} "
            f"(expected {ex['expected']!r}) {ex['file']}"
        )
    return "\n".join(lines)


def _readme(summary: dict[str, Any], text: str) -> str:
    return (
        f"""# speceyes demo output

SpecEyes (judge -> speculate -> gate -> agent loop) against the agent-only baseline on
{summary["n"]} held-out queries of the demo world: one coloured object in a 1024 px scene, in
the region the question names. Large objects can be seen at the models' 112-128 px input;
tiny ones ({summary["n_needs_zoom"]} queries) only after zooming. The large model (Qwen2.5-VL,
2.75M parameters) judges and, as the agent, thinks, zooms on the region and answers; the small
one (Qwen3-VL, 1.4M parameters) drafts answers. Both were trained on a CPU with
`speceyes train-demo`. Timings are this machine's, with cross-query batching.
The models ran on: {(summary.get("engine") or {}).get("description", "transformers")}.

```
{text}
```

## Files

| file | what it shows |
|---|---|
| `workflow.png` | the graph: the judge's yes/no, the gate's accept/reject, the agent loop |
| `examples/*.png` | one query per route: the question, the zoom box the agent chose, the crop, each configuration's answer |
| `run-speceyes/report.md` | SpecEyes against the agent-only run: accuracy per split, speedups, the offline tau sweep |
| `gate/report.md` | the small model's draft on every query: separability histogram with tau, ROC against softmax confidence |
| `run-*/records.jsonl` | one JSON line per query: route, judge output, draft with its top-K log-probs, agent steps, timings |
| `scenes/` | the query images |

## Definitions

"""
        + "\n".join(f"- **{k}**: {v}." for k, v in summary["definitions"].items())
        + "\n"
    )


# --- annotated examples ---------------------------------------------------------------------------


def _box(record: dict | None) -> list[int] | None:
    for step in (record or {}).get("agent_steps") or []:
        for call in step.get("tool_calls") or []:
            if call.get("box"):
                return [int(v) for v in call["box"]]
    return None


def _describe(mode: str, record: dict | None) -> str:
    if record is None:
        return f"{LABELS[mode]}: not run"
    if record.get("error"):
        return f"{LABELS[mode]}: error {record['error'][:60]}"
    draft = record.get("draft") or {}
    parts = [f"{LABELS[mode]}: {record['answer']!r} ({'right' if record['correct'] else 'wrong'})"]
    if mode == "speceyes":
        parts.append(f"route {record['route']}")
    if draft.get("score") is not None and mode != "agent":
        parts.append(f"draft {draft.get('text')!r}, gate score {draft['score']:.3f}")
    if record.get("agent_steps"):
        parts.append(f"{len(record['agent_steps'])} agent turns")
    parts.append(f"{record['latency_s']:.2f} s")
    return ", ".join(parts)


def write_examples(
    folder: Path, queries: list[BenchQuery], records: dict[str, list[dict]]
) -> list[dict[str, Any]]:
    """One annotated picture per SpecEyes route: the scene with the question and the agent's
    zoom box, the crop it got, and every configuration's answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    folder.mkdir(parents=True, exist_ok=True)
    by_id = {m: {r["id"]: r for r in rs} for m, rs in records.items()}
    query = {q.id: q for q in queries}
    written = []
    for route in ROUTE_WORDS:
        record = next((r for r in records["speceyes"] if r["route"] == route), None)
        if record is None:
            continue
        q = query[record["id"]]
        image = load_image(q.image)  # upright, as the models saw it
        agent_record = by_id["agent"].get(q.id)
        box = _box(record) or _box(agent_record)
        fig, (ax_scene, ax_crop) = plt.subplots(
            1, 2, figsize=(10, 6.2), gridspec_kw={"width_ratios": [1, 1]}
        )
        ax_scene.imshow(image)
        ax_scene.set_title("the query image (1024 px)", fontsize=10)
        if box:
            x1, y1, x2, y2 = box
            ax_scene.add_patch(
                Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, ec="magenta", lw=2.5, ls="--")
            )
            ax_crop.imshow(image[y1:y2, x1:x2])
            ax_crop.set_title(f"the agent's zoom box {box} -> crop", fontsize=10)
        else:
            ax_crop.text(0.5, 0.5, "no zoom", ha="center", va="center", fontsize=14)
        for ax in (ax_scene, ax_crop):
            ax.set_xticks([])
            ax.set_yticks([])
        expected = q.meta["answer_text"]
        fig.suptitle(
            f"{q.id} ({q.split}): {q.question}  expected: {expected}\n{ROUTE_WORDS[route]}",
            fontsize=11,
        )
        notes = [_describe(m, by_id[m].get(q.id)) for m in ("agent", "speceyes", "small")]
        fig.text(
            0.02, 0.02, "\n".join(textwrap.shorten(t, 150) for t in notes), fontsize=9,
            family="monospace", va="bottom",
        )  # fmt: skip
        fig.tight_layout(rect=(0, 0.1, 1, 0.92))
        name = f"{route}-{q.id}.png"
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        written.append(
            {
                "route": route,
                "id": q.id,
                "question": q.question,
                "answer": record["answer"],
                "expected": expected,
                "file": f"examples/{name}",
            }
        )
    return written
