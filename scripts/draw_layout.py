"""The package's map as a picture: which part imports which (docs/architecture.md).

Collapses the import graph (grimp, the library under import-linter) to the parts of the
layers contract in pyproject.toml and draws it with Graphviz; prints the figures the docs
quote. ``--at REV`` reads a git revision instead of the working tree (the flat layout before
issue 57 has no subpackages for the gate, the agents or the integrations: its modules are
grouped by the same names so the two pictures compare).

    python scripts/draw_layout.py                 # writes docs/layout.svg, prints figures
    python scripts/draw_layout.py --at 311e16b    # the layout before, figures only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# modules of the flat layout, by the part they now belong to (for --at before the move)
BEFORE = {
    "gate": "separability calibration label_free drift online_gate online_steps ledger "
    "gate_keys shadowing",
    "agents": "agent toolsets",
    "graph": "options nodes fallback specreason tool_speculation parallel_drafts drawing graph",
    "integrations": "middleware compose studio store_reading draft_reply turns",
}


def parts(layers: list[str]) -> dict[str, str]:
    """module or package name -> its part's label (the layer's members, short)."""
    out = {}
    for layer in layers:
        members = [m.strip() for m in layer.replace("|", ":").split(":")]
        label = " · ".join(m.removeprefix("speceyes_graph.") for m in members)
        for m in members:
            out[m] = label
    return out


def part_of(module: str, table: dict[str, str], flat: bool) -> str | None:
    if flat:
        head = module.split(".")
        if len(head) > 1:
            for part, names in BEFORE.items():
                if head[1] in names.split():
                    return table.get(f"speceyes_graph.{part}")
    bits = module.split(".")
    for n in range(len(bits), 0, -1):
        name = ".".join(bits[:n])
        if name in table:
            return table[name]
    return None


def collapse(graph: grimp.ImportGraph, table: dict[str, str], flat: bool) -> Counter:
    edges: Counter = Counter()
    for module in graph.modules:
        a = part_of(module, table, flat)
        for target in graph.find_modules_directly_imported_by(module):
            b = part_of(target, table, flat)
            if a and b and a != b:
                edges[(a, b)] += 1
    return edges


def figures(src: Path, flat: bool, table: dict[str, str], order: list[str]) -> Counter:
    sys.path.insert(0, str(src))
    graph = grimp.build_graph("speceyes_graph", "speceyes_tools", cache_dir=None)
    sys.path.pop(0)
    top = sorted(
        p.stem
        for p in (src / "speceyes_graph").glob("*.py")
        if p.stem not in ("__init__", "__main__")
    )
    packages = sorted(p.parent.name for p in (src / "speceyes_graph").glob("*/__init__.py"))
    edges = collapse(graph, table, flat)
    rank = {label: i for i, label in enumerate(order)}
    upward = [(a, b, n) for (a, b), n in edges.items() if rank[a] > rank[b]]
    print(
        f"modules at the top of speceyes_graph/: {len(top)}; subpackages: {len(packages)} "
        f"({', '.join(packages)}); modules in all: {len(graph.modules)}"
    )
    print(
        f"imports between parts: {sum(edges.values())} over {len(edges)} edges; "
        f"running back up: {len(upward)} {upward if upward else ''}"
    )
    return edges


def dot(edges: Counter, order: list[str]) -> str:
    lines = [
        "digraph layout {",
        '  rankdir=TB; node [shape=box, style="rounded,filled", '
        'fillcolor="#eef3fb", fontname="Helvetica", fontsize=11];',
        '  edge [color="#7a8699", arrowsize=0.6, fontname="Helvetica", fontsize=9];',
    ]
    for i, label in enumerate(order):
        lines.append(f'  n{i} [label="{label}"];')
    index = {label: i for i, label in enumerate(order)}
    for (a, b), n in sorted(edges.items(), key=lambda e: (index[e[0][0]], index[e[0][1]])):
        lines.append(f'  n{index[a]} -> n{index[b]} [label="{n}"];')
    lines.append("}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--at", help="a git revision to read instead of the working tree")
    parser.add_argument("--out", default=str(ROOT / "docs" / "layout.svg"))
    args = parser.parse_args()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    table = parts(layers)
    order = list(dict.fromkeys(table.values()))
    if args.at:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(
                ["git", "archive", args.at, "speceyes_graph", "tools"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            (Path(tmp) / "tools").rename(Path(tmp) / "speceyes_tools")
            figures(Path(tmp), True, table, order)
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "speceyes_graph").symlink_to(ROOT / "speceyes_graph")
        (Path(tmp) / "speceyes_tools").symlink_to(ROOT / "tools")
        edges = figures(Path(tmp), False, table, order)
    svg = subprocess.run(
        ["dot", "-Tsvg"], input=dot(edges, order), capture_output=True, text=True, check=True
    ).stdout
    Path(args.out).write_text(svg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
