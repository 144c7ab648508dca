"""The demo: run it, retrain its checkpoints, build tiny random checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    checkpoints = None
    if args.checkpoints:
        checkpoints = {k: Path(args.checkpoints) / k for k in ("small", "large")}
    if args.n < 1:
        raise SystemExit("speceyes demo: --n must be at least 1")
    if args.depth < 0:
        raise SystemExit("speceyes demo: --depth must be at least 0")
    if not 0 < args.max_risk < 1 or not (args.shadow_rate is None or 0 < args.shadow_rate <= 1):
        raise SystemExit("speceyes demo: --max-risk must be in (0, 1), --shadow-rate in (0, 1]")
    if bool(args.small_url) != bool(args.large_url):
        raise SystemExit("speceyes demo: give both --small-url and --large-url, or neither")
    if args.small_url and args.engine != "vllm":
        raise SystemExit("speceyes demo: --small-url and --large-url go with --engine vllm")
    summary = run_demo(
        args.out,
        args.n,
        batch_size=args.batch_size,
        checkpoints=checkpoints,
        progress=not args.no_progress,
        specreason=args.specreason,
        engine=args.engine,
        small_url=args.small_url,
        large_url=args.large_url,
        depth=args.depth,
        online={"max_risk": args.max_risk, "shadow_rate": args.shadow_rate}
        if args.online
        else None,
    )
    return 1 if summary["errors"] else 0


def cmd_train_demo(args: argparse.Namespace) -> int:
    """Both models train at once, one process and one thread each (better use of 2 cores)."""
    import multiprocessing as mp

    from ..demo.training import train_demo

    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    if not kinds or set(kinds) - {"small", "large"}:
        raise SystemExit(
            f"speceyes train-demo: --models takes small, large or small,large, not {args.models!r}"
        )
    minutes = {"large": args.minutes, "small": args.small_minutes}
    kwargs = {"seed": args.seed, "max_steps": args.steps}
    if len(kinds) == 1:
        train_demo(args.out, kinds[0], threads=args.threads, minutes=minutes[kinds[0]], **kwargs)
        return 0
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=train_demo,
            args=(args.out, k),
            kwargs={**kwargs, "minutes": minutes[k], "threads": 1, "position": i},
        )
        for i, k in enumerate(kinds)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(p.exitcode or 0 for p in procs)


def cmd_make_tiny_models(args: argparse.Namespace) -> int:
    from ..demo.tiny import make_tiny_models

    paths = make_tiny_models(args.dir, seed=args.seed)
    for kind, path in paths.items():
        size = sum(f.stat().st_size for f in Path(path).iterdir()) / 2**20
        print(f"{kind}: {path} ({size:.1f} MiB)")
    return 0


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser(
        "demo", help="SpecEyes vs agent-only on the embedded demo checkpoints (offline)"
    )
    p.add_argument(
        "-o", "--out", default="speceyes-demo", help="output folder (default: ./speceyes-demo)"
    )
    p.add_argument(
        "--n",
        type=int,
        default=60,
        help="number of held-out queries (the README's figures use 300)",
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--checkpoints", help="a train-demo output folder instead of the shipped checkpoints"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--specreason",
        action="store_true",
        help="also run the SpecReason baseline (about doubles the run time)",
    )
    p.add_argument(
        "--depth",
        type=int,
        default=0,
        help="also run SpecEyes with depth-D speculation (the small model zooms first on "
        "queries the judge sends to the tools), beside depth 0",
    )
    p.add_argument(
        "--online",
        action="store_true",
        help="also run SpecEyes with the online gate (tau follows the labels the run gives; "
        "a share of accepted drafts shadow-verified by the agent), against agent only's answers",
    )
    p.add_argument(
        "--max-risk", type=float, default=0.05, help="with --online: the target risk (0.05)"
    )
    p.add_argument(
        "--shadow-rate",
        type=float,
        default=None,
        help="with --online: the share of accepted drafts shadow-verified (default the "
        "gate's policy)",
    )
    p.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        default="transformers",
        help="where the models run: transformers in this process (default), or vLLM servers "
        "(started for the demo checkpoints; see `speceyes serve-model --help` for the engine)",
    )
    p.add_argument(
        "--small-url",
        help="with --engine vllm: a running server of the small checkpoint (http://host:port/v1"
        "[#name]) instead of starting one",
    )
    p.add_argument("--large-url", help="the same for the large checkpoint")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "train-demo", help="train the demo checkpoints on the synthetic world (CPU or GPU)"
    )
    p.add_argument("out")
    p.add_argument(
        "--minutes", type=float, default=80.0, help="wall-clock budget of the large model"
    )
    p.add_argument(
        "--small-minutes", type=float, default=20.0, help="wall-clock budget of the small model"
    )
    p.add_argument(
        "--steps", type=int, help="a fixed number of steps instead (reproducible from the seed)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--models", default="small,large", help="small, large or small,large (in parallel)"
    )
    p.add_argument("--threads", type=int, help="torch threads when training a single model")
    p.set_defaults(func=cmd_train_demo)

    p = sub.add_parser(
        "make-tiny-models",
        help="build tiny random Qwen3-VL (DIR/small) and Qwen2.5-VL (DIR/large) checkpoints offline",
    )
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_make_tiny_models)
