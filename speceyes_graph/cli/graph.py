"""Drawing the workflow, and the offline example."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..state import Mode


def _placeholder_graph(mode: Mode, tools: str):
    """A graph with scripted models, for drawing only (drawing needs no weights)."""
    from ..demo.example import make_example_models
    from ..graph.build import create_speceyes_graph

    judge, speculator, agent = make_example_models()
    return create_speceyes_graph(  # only the models the mode uses, so only its nodes are drawn
        judge=judge if mode == "speceyes" else None,
        speculator=speculator if mode != "agent" else None,
        agent=agent if mode != "small" else None,
        mode=mode,
        tools=tools,
    )


def cmd_graph(args: argparse.Namespace) -> int:
    from ..graph.drawing import draw

    out = draw(_placeholder_graph(args.mode, args.tools), args.format)
    if args.output:
        Path(args.output).write_bytes(out if isinstance(out, bytes) else out.encode())
        print(f"wrote {args.output}")
    elif isinstance(out, bytes):
        print("PNG output needs -o FILE", file=sys.stderr)
        return 2
    else:
        print(out)
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    from ..demo.example import run_example

    results = run_example(Path(args.dir) if args.dir else None)
    failed = [r for r in results if r.get("error")]
    return 1 if failed else 0


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser("graph", help="draw the workflow (subgraph expanded)")
    p.add_argument("--format", choices=["mermaid", "ascii", "png", "dot"], default="mermaid")
    p.add_argument(
        "--mode", choices=["speceyes", "agent", "small", "specreason"], default="speceyes"
    )
    p.add_argument("--tools", default="deepeyes", help="toolset name or TOML/YAML file")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("example", help="run the built-in offline example (scripted models)")
    p.add_argument("--dir", help="where to write the example images (default: a temp folder)")
    p.set_defaults(func=cmd_example)
