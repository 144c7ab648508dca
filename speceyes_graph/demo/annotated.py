"""Annotated example scenes for ``speceyes demo``: one query per route, as a picture.

Each shows the scene with the question and the zoom box, the crop, and every
configuration's answer, so a reader sees what the figures mean on one query.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from speceyes_tools.images import load_image

from ..benchmarks.datasets import BenchQuery
from .summary import LABELS, ROUTE_WORDS

__all__ = ["write_examples"]


def _box(record: dict | None) -> list[int] | None:
    """The first zoom box of the query: the agent's, or the small model's own (depth D)."""
    record = record or {}
    steps = record.get("agent_steps") or (record.get("tool_draft") or {}).get("steps") or []
    for step in steps:
        for call in step.get("tool_calls") or []:
            if call.get("box"):
                return [int(v) for v in call["box"]]
    return None


def _describe(mode: str, record: dict | None) -> str:
    name = "SpecEyes depth D" if mode == "depth" else LABELS[mode]
    if record is None:
        return f"{name}: not run"
    if record.get("error"):
        return f"{name}: error {record['error'][:60]}"
    draft = record.get("draft") or {}
    tool = record.get("tool_draft") or {}
    parts = [f"{name}: {record['answer']!r} ({'right' if record['correct'] else 'wrong'})"]
    if mode in ("speceyes", "depth"):
        parts.append(f"route {record['route']}")
    if draft.get("score") is not None and mode != "agent":
        parts.append(f"draft {draft.get('text')!r}, gate score {draft['score']:.3f}")
    if tool.get("score") is not None:
        parts.append(f"small loop {tool.get('text')!r}, gate score {tool['score']:.3f}")
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
    # the first query of each route by id, not by when it finished: the same pictures every run
    ordered = {m: sorted(rs, key=lambda r: r["id"]) for m, rs in records.items()}
    for route in ROUTE_WORDS:
        record = next((r for r in ordered["speceyes"] if r["route"] == route), None)
        if record is None and "depth" in records:  # speculative-tools: the depth-D run's
            record = next((r for r in ordered["depth"] if r["route"] == route), None)
        if record is None:
            continue
        q = query[record["id"]]
        assert q.image is not None  # the demo's scenes are files (demo_queries writes them)
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
        shown = (
            ("agent", "speceyes", "depth", "small")
            if "depth" in records
            else ("agent", "speceyes", "small")
        )
        notes = [_describe(m, by_id[m].get(q.id)) for m in shown]
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
