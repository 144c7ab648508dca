"""Serving: server configs for an install, and engine servers for a checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def cmd_serve_config(args: argparse.Namespace) -> int:
    from ..deploy import write_server_configs

    try:
        written = write_server_configs(args.dir, overwrite=args.force)
    except FileExistsError as exc:
        print(f"speceyes: {exc}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in written))
    print(f"serve: cd {args.dir} && langgraph dev   (pip install 'langgraph-cli[inmem]')")
    print("   or: aegra serve -c aegra.json         (several instances: the deployment guide)")
    print("models: SPECEYES_SMALL_URL/_MODEL and SPECEYES_LARGE_URL/_MODEL (served), or")
    print("        SPECEYES_SMALL_PATH and SPECEYES_LARGE_PATH (local); none: the demo checkpoints")
    return 0


def cmd_serve_model(args: argparse.Namespace) -> int:
    from ..models.servers import SGLangServer, VLLMServer

    options = {"name": args.name, "host": args.host, "port": args.port, "python": args.python}
    server = (
        VLLMServer(args.model, eager=args.eager, dtype=args.dtype, **options)
        if args.engine == "vllm"
        else SGLangServer(args.model, dtype=args.dtype, **options)
    )
    with server as s:
        print(f"{s.url} up in {s.started_s:.0f} s, serving {s.models()[0]['id']}; Ctrl-C stops it")
        assert s.process is not None
        s.process.wait()
    return 0


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser(
        "serve-config",
        help="write langgraph.json and aegra.json for serving the graphs from this install",
    )
    p.add_argument("dir", type=Path, help="the folder to write them into (made if missing)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.set_defaults(func=cmd_serve_config)

    p = sub.add_parser(
        "serve-model",
        help="serve a checkpoint on vLLM or SGLang, as the graph expects (top log-probs, names)",
    )
    p.add_argument("model", help="a checkpoint folder or hub id")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--name", help="the served model name (e.g. small, large)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: a free port")
    p.add_argument("--dtype", default="auto", help="the engine's --dtype (default: auto)")
    p.add_argument(
        "--eager", action="store_true", help="vLLM: no graph compilation (starts faster)"
    )
    p.add_argument(
        "--python",
        help="the Python of the engine's environment (default: SPECEYES_<ENGINE>_PYTHON, a "
        ".venv-<engine> here, else this Python if it has the engine)",
    )
    p.set_defaults(func=cmd_serve_model)
