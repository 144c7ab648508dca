"""The ``speceyes`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _placeholder_graph(mode: str, tools: str):
    """A graph with scripted models, for drawing only (drawing needs no weights)."""
    from .example import make_example_models
    from .graph import create_speceyes_graph

    judge, speculator, agent = make_example_models()
    return create_speceyes_graph(
        judge=judge, speculator=speculator, agent=agent, mode=mode, tools=tools
    )


def cmd_graph(args: argparse.Namespace) -> int:
    from .drawing import draw

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
    from .example import run_example

    results = run_example(Path(args.dir) if args.dir else None)
    failed = [r for r in results if r.get("error")]
    return 1 if failed else 0


def cmd_make_tiny_models(args: argparse.Namespace) -> int:
    from .tiny import make_tiny_models

    paths = make_tiny_models(args.dir, seed=args.seed)
    for kind, path in paths.items():
        size = sum(f.stat().st_size for f in Path(path).iterdir()) / 2**20
        print(f"{kind}: {path} ({size:.1f} MiB)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speceyes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("graph", help="draw the workflow (subgraph expanded)")
    p.add_argument("--format", choices=["mermaid", "ascii", "png", "dot"], default="mermaid")
    p.add_argument("--mode", choices=["speceyes", "agent", "small"], default="speceyes")
    p.add_argument("--tools", default="deepeyes", help="toolset name or TOML/YAML file")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("example", help="run the built-in offline example (scripted models)")
    p.add_argument("--dir", help="where to write the example images (default: a temp folder)")
    p.set_defaults(func=cmd_example)

    p = sub.add_parser(
        "make-tiny-models",
        help="build tiny random Qwen3-VL (DIR/small) and Qwen2.5-VL (DIR/large) checkpoints offline",
    )
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_make_tiny_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
