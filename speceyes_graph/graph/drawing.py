"""Draw the workflow, subgraph expanded, offline.

LangGraph's default PNG renderer calls a web service; here PNG comes from Graphviz's
``dot`` binary when it is installed, else from matplotlib with the same layered layout
(grandalf) that LangGraph's ASCII drawing uses. Mermaid and ASCII come from LangGraph.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from typing import Literal

from langchain_core.runnables.graph import Graph

__all__ = ["draw", "to_dot"]

Format = Literal["mermaid", "ascii", "png", "dot"]


def _graph(graph) -> Graph:
    compiled = (
        graph.compile() if hasattr(graph, "compile") and not hasattr(graph, "get_graph") else graph
    )
    return compiled.get_graph(xray=True)


def draw(graph, fmt: Format = "mermaid") -> str | bytes:
    """The workflow of a ``StateGraph`` or compiled graph as text (mermaid/ascii/dot) or PNG bytes."""
    g = _graph(graph)
    if fmt == "mermaid":
        return g.draw_mermaid()
    if fmt == "ascii":
        return g.draw_ascii()
    if fmt == "dot":
        return to_dot(g)
    if fmt == "png":
        dot = shutil.which("dot")
        if dot:
            return subprocess.run(
                [dot, "-Tpng"], input=to_dot(g).encode(), capture_output=True, check=True
            ).stdout
        return _png_matplotlib(g)
    raise ValueError(f"unknown format {fmt!r}; use mermaid, ascii, png or dot")


def _label(node_id: str) -> str:
    last = node_id.split(":")[-1]
    return {"__start__": "START", "__end__": "END"}.get(last, last)


def to_dot(g: Graph) -> str:
    """Graphviz source; subgraph nodes (``agent_loop:agent``) are grouped in a cluster."""
    lines = [
        "digraph speceyes {",
        '  rankdir=TB; dpi=150; nodesep=0.6; ranksep=0.55; fontname="Helvetica";',
        '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica", fontsize=14];',
        '  edge [fontname="Helvetica", fontsize=12, fontcolor="#1f4e99"];',
    ]
    clusters: dict[str, list[str]] = {}
    for node_id in g.nodes:
        prefix = node_id.rsplit(":", 1)[0] if ":" in node_id else ""
        shape = (
            ', shape=oval, fillcolor="#dddddd"'
            if node_id in ("__start__", "__end__") or node_id.endswith(("__start__", "__end__"))
            else ""
        )
        decl = f'"{node_id}" [label="{_label(node_id)}"{shape}];'
        clusters.setdefault(prefix, []).append(decl)
    for prefix, decls in clusters.items():
        if prefix:
            lines.append(f'  subgraph "cluster_{prefix}" {{ label="{prefix}"; style=dashed;')
            lines += [f"    {d}" for d in decls]
            lines.append("  }")
        else:
            lines += [f"  {d}" for d in decls]
    for e in g.edges:
        label = f' label=" {e.data} "' if e.data else ""
        style = f" [style=dashed,{label}]" if e.conditional else ""
        lines.append(f'  "{e.source}" -> "{e.target}"{style};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _png_matplotlib(g: Graph) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from grandalf.graphs import Edge, Vertex
    from grandalf.graphs import Graph as GGraph
    from grandalf.layouts import SugiyamaLayout

    class _View:
        w, h = 140, 40

    vertices = {nid: Vertex(nid) for nid in g.nodes}
    for v in vertices.values():
        v.view = _View()
    edges = [e for e in g.edges if e.source != e.target]  # grandalf cannot lay out self-loops
    gg = GGraph(
        list(vertices.values()), [Edge(vertices[e.source], vertices[e.target]) for e in edges]
    )
    for comp in gg.C:
        layout = SugiyamaLayout(comp)
        roots = [v for v in comp.sV if len(v.e_in()) == 0]
        layout.init_all(roots=roots, optimize=True)
        layout.draw()
    xs = [v.view.xy[0] for v in vertices.values()]
    ys = [v.view.xy[1] for v in vertices.values()]
    fig, ax = plt.subplots(
        figsize=(max(4, (max(xs) - min(xs)) / 60 + 3), max(4, (max(ys) - min(ys)) / 50 + 2))
    )
    for e in edges:
        (x1, y1), (x2, y2) = vertices[e.source].view.xy, vertices[e.target].view.xy
        if e.data:
            ax.text(
                (x1 + x2) / 2, -(y1 + y2) / 2, str(e.data), ha="center", va="center", fontsize=9,
                color="#1f4e99", bbox={"boxstyle": "round", "fc": "white", "ec": "none"},
            )  # fmt: skip
        ax.annotate(
            "",
            xy=(x2, -y2),
            xytext=(x1, -y1),
            arrowprops={
                "arrowstyle": "-|>",
                "ls": "--" if e.conditional else "-",
                "shrinkA": 12,
                "shrinkB": 12,
            },
        )
    for nid, v in vertices.items():
        x, y = v.view.xy
        ax.text(
            x,
            -y,
            _label(nid),
            ha="center",
            va="center",
            bbox={"boxstyle": "round", "fc": "#eef3fb"},
        )
    ax.set_xlim(min(xs) - 90, max(xs) + 90)  # text and arrows do not autoscale the axes
    ax.set_ylim(-max(ys) - 40, -min(ys) + 40)
    ax.set_axis_off()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
