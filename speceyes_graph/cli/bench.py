"""Benchmarks: the synthetic suite and the resumable runner."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any


def cmd_synth(args: argparse.Namespace) -> int:
    from ..benchmarks.synthetic import generate_suite

    generate_suite(
        args.dir, args.n, seed=args.seed, zoom_fraction=args.zoom_fraction, max_side=args.max_side
    )
    print(f"wrote {args.n} queries to {args.dir}")
    return 0


def check_bench_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument checked before anything loads, with a message that says what to do."""
    from ..models.specs import SpecError, parse_model_spec

    needs = {
        "speceyes": ("small", "large"),
        "agent": ("large",),
        "small": ("small",),
        "specreason": ("small", "large"),
    }[args.mode]
    for role in needs:
        if not getattr(args, role):
            parser.error(
                f"--mode {args.mode} needs --{role} (demo, tiny:DIR, a checkpoint, a hub id or openai:URL#NAME)"
            )
    if not Path(args.data).exists():
        parser.error(f"--data {args.data}: no such file or folder")
    if args.max_new_tokens is None:  # the published step length of the agent
        args.max_new_tokens = 2048 if args.tools == "thyme" else 512
    if args.threshold is None:  # the published tau of the agent: 0.95 for Thyme, else 0.98
        args.threshold = 0.95 if args.tools == "thyme" else 0.98
    if not 0.0 <= args.threshold <= 1.0:
        parser.error(f"--threshold must be in [0, 1], got {args.threshold}")
    for name, low in (
        ("top_k", 2),
        ("batch_size", 1),
        ("max_new_tokens", 1),
        ("chunk_size", 1),
    ):
        if getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}")
    if args.max_agent_steps is not None and args.max_agent_steps < 1:
        parser.error("--max-agent-steps must be at least 1")
    if args.speculation_depth < 0:
        parser.error("--speculation-depth must be at least 0")
    if args.tau_depth is not None and not 0.0 <= args.tau_depth <= 1.0:
        parser.error(f"--tau-depth must be in [0, 1], got {args.tau_depth}")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.max_risk is not None:
        if not 0 < args.max_risk < 1 or not 0 < args.shadow_rate <= 1:
            parser.error("--max-risk must be in (0, 1) and --shadow-rate in (0, 1]")
        if args.mode != "speceyes":
            parser.error("--max-risk gates SpecEyes' drafts: it needs --mode speceyes")
        if args.gate_warmup < 0:
            parser.error("--gate-warmup must be at least 0")
    if args.gate:
        try:
            from ..gate.separability import GateConfig

            GateConfig.load(args.gate)
        except (OSError, ValueError, TypeError) as exc:
            parser.error(f"--gate {args.gate}: {exc}")
    demo = [role for role in needs if getattr(args, role) == "demo"]
    if demo and len(demo) != len(needs):
        parser.error(
            "use demo for both models or for neither: they were trained together, on their own prompts"
        )
    args.specs = {}
    for role in needs:
        try:
            args.specs[role] = parse_model_spec(getattr(args, role), role)
        except SpecError as exc:
            parser.error(f"--{role}: {exc}")


def load_model(spec: Any, role: str, **settings: Any) -> Any:
    """The chat model a checked spec names; ``demo`` is the shipped checkpoint of the role
    (the large one judges answers in ``report --judge-model demo``)."""
    from ..models.specs import ModelSpec, load_chat_model

    if spec.kind == "demo":
        from ..demo import demo_checkpoints

        spec = ModelSpec("path", str(demo_checkpoints()["small" if role == "small" else "large"]))
    return load_chat_model(spec, **settings)


def _batch_tokens(value: str) -> int | str | None:
    if value.lower() in ("auto", "none"):
        return None if value.lower() == "none" else "auto"
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: write a positive number, auto or none")
    return tokens


def cmd_bench(args: argparse.Namespace) -> int:
    from ..agents.loop import LoopOptions
    from ..benchmarks import load_benchmark, run_benchmark
    from ..benchmarks.datasets import count_benchmark
    from ..benchmarks.runner import RunLocked
    from ..gate.separability import GateConfig
    from ..graph.build import create_speceyes_graph
    from ..graph.options import SpeculationOptions

    specs = args.specs
    gate = (
        GateConfig.load(args.gate)
        if args.gate
        else GateConfig(tau=args.threshold, k=args.top_k, aggregation=args.aggregation)
    )
    small = large = None
    if args.tau_depth is not None:
        gate = gate.replace(tau_depth=args.tau_depth)
    if "small" in specs:
        small = load_model(
            specs["small"],
            "small",
            top_logprobs=gate.k,
            max_new_tokens=20,  # drafts; small-loop turns ask for --max-new-tokens each
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
        )
    if "large" in specs:
        large = load_model(
            specs["large"],
            "large",
            top_logprobs=None,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
        )
    settings: dict = {"tools": args.tools, "loop": LoopOptions()}
    if all(spec.kind == "demo" for spec in specs.values()):
        from ..demo import DEMO_GRAPH_SETTINGS

        settings.update(DEMO_GRAPH_SETTINGS)  # the prompts the demo checkpoints learned
    if args.max_agent_steps is not None:
        settings["loop"] = dataclasses.replace(settings["loop"], max_steps=args.max_agent_steps)
    settings["gate"] = gate
    online = None
    if args.max_risk is not None:  # the online gate, starting from this gate
        from ..gate.online import OnlineGate, RiskOptions

        online = settings["gate"] = OnlineGate(
            args.max_risk, args.shadow_rate, config=gate, risk=RiskOptions(warmup=args.gate_warmup)
        )
    if args.tools == "thyme" and "prompts" not in settings:
        from ..prompts import Prompts

        # the published Thyme runs end POPE's yes/no questions with this line
        tail = "Please answer 'yes' or 'no'." if args.benchmark == "pope" else ""
        settings["prompts"] = Prompts.thyme(open_tail=tail)
    settings["speculation"] = SpeculationOptions(
        start=args.speculation or "after_judge",
        depth=args.speculation_depth or 0,
        step_tokens=args.max_new_tokens if args.speculation_depth else None,
    )
    builder = create_speceyes_graph(speculator=small, agent=large, mode=args.mode, **settings)
    graph = builder.compile()
    schedule = None
    if args.schedule == "official":
        from ..benchmarks.schedule import OfficialSchedule

        schedule = OfficialSchedule(builder, args.mode, args.chunk_size)
    queries = load_benchmark(args.benchmark, args.data, shuffle_options=args.shuffle_options)
    recorded = {k: v for k, v in vars(args).items() if k not in ("func", "check", "specs")}
    try:
        summary = run_benchmark(
            graph,
            queries,
            args.out,
            mode=args.mode,
            concurrency=2 * args.batch_size,
            limit=args.limit,
            retry_errors=args.retry_errors,
            settings=recorded,
            total=count_benchmark(args.benchmark, args.data),
            schedule=schedule,
        )
    except RunLocked as exc:
        print(f"speceyes bench: {exc}", file=sys.stderr)
        return 2
    if online is not None and not summary["interrupted"]:
        online.shadows.drain(timeout=600)  # the last shadow runs' labels, and their cost
        state = online.state()
        runs = state["shadow_runs"]
        print(
            f"online gate: tau {state['start_tau']} -> {state['tau']}; {runs['started']} shadow "
            f"runs ({runs['labelled']} labelled, {runs['failed']} failed, {runs['dropped']} "
            f"dropped, {runs['seconds']:.1f} s); `speceyes report {args.out}` draws its path"
        )
    if summary["interrupted"]:
        print(
            f"interrupted after {summary['written']} queries ({summary['total']} recorded in "
            f"{args.out}); rerun the same command to resume",
            file=sys.stderr,
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(130)  # do not wait for the queries still running: their results are not kept
    print(
        f"{summary['total']} queries recorded in {args.out} ({summary['written']} this run); "
        f"accuracy {summary['accuracy']:.3f}; routes {summary['routes']}"
    )
    for line in _batching_lines({"small": small, "large": large}):
        print(line)
    return 0


def _batching_lines(models: dict[str, Any]) -> list[str]:
    """How each local model's calls batched this run, and any memory trouble (a batch that
    ran out of memory was split and the token budget lowered: worth knowing at scale)."""
    lines = []
    for role, model in models.items():
        stats = getattr(getattr(model, "scheduler", None), "stats", None)
        if stats is None or not stats.calls:
            continue
        line = (
            f"{role}: {stats.calls} generate call{'s' if stats.calls != 1 else ''}, "
            f"mean batch {stats.mean_batch:.1f}, "
            f"largest {stats.max_tokens:,} padded tokens"
        )
        if stats.out_of_memory:
            line += (
                f"; {stats.out_of_memory} ran out of memory ({stats.split} split), "
                f"max_batch_tokens now {stats.max_batch_tokens}"
            )
        lines.append(line)
    return lines


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser("synth", help="generate the synthetic high-resolution suite (V* layout)")
    p.add_argument("dir")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--zoom-fraction", type=float, default=0.5, help="share of queries whose target is small"
    )
    p.add_argument("--max-side", type=int, default=7680, help="largest image width to generate")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("bench", help="run a benchmark (resumable; one JSON line per query)")
    p.add_argument("--benchmark", required=True, choices=["vstar", "hrbench", "pope", "synthetic"])
    p.add_argument("--data", required=True, help="dataset folder or file")
    p.add_argument(
        "--small",
        help="small model: demo (the shipped checkpoints), tiny:DIR, a checkpoint folder, a hub "
        "id, or openai:URL#NAME[?max_pixels=N]",
    )
    p.add_argument("--large", help="large model (judge and agent), same forms")
    p.add_argument(
        "--mode", choices=["speceyes", "agent", "small", "specreason"], default="speceyes"
    )
    p.add_argument(
        "--threshold", type=float, default=None, help="tau (default 0.98; 0.95 with --tools thyme)"
    )
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--aggregation", choices=["min", "mean", "bottom-q"], default="min")
    p.add_argument(
        "--max-risk",
        type=float,
        help="gate online (docs/calibration.md, an online gate): tau moves from the one above so "
        "that at most this share of queries is answered by a draft that disagrees with the agent",
    )
    p.add_argument(
        "--shadow-rate",
        type=float,
        default=0.1,
        help="with --max-risk: the share of accepted drafts the agent verifies (0.1)",
    )
    p.add_argument(
        "--gate-warmup",
        type=int,
        default=200,
        help="with --max-risk: queries before tau moves (200; the gate is this run's alone)",
    )
    p.add_argument(
        "--gate", help="a gate file from `speceyes calibrate` (replaces the three above)"
    )
    p.add_argument(
        "--batch-size", type=int, default=16, help="max batch per model call (2x queries in flight)"
    )
    p.add_argument(
        "--max-batch-tokens",
        type=_batch_tokens,
        default="auto",
        help="local models: most padded tokens per batch; 'auto' (default: from free GPU "
        "memory) or 'none' (count only)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="per agent step (default: the published 512 for DeepEyes, 2048 for Thyme)",
    )
    p.add_argument(
        "--max-agent-steps", type=int, default=None, help="default 6 (DeepEyes), 5 (Thyme)"
    )
    p.add_argument(
        "--speculation-depth",
        type=int,
        default=0,
        help="tool steps the small model may take on queries the judge sends to the tools, "
        "before its answer is gated (default 0: the paper's tool-free speculation)",
    )
    p.add_argument(
        "--tau-depth",
        type=float,
        default=None,
        help="the gate threshold of those answers (default: tau, or the gate file's tau_depth)",
    )
    p.add_argument(
        "--tools",
        default="deepeyes",
        help="deepeyes (zoom tool), thyme (the model writes Python, run in a bubblewrap "
        "sandbox), vision, or a TOML/YAML toolset",
    )
    p.add_argument(
        "--schedule",
        choices=["concurrent", "official"],
        default="concurrent",
        help="concurrent: everything overlapped and batched across queries (this package); "
        "official: lockstep chunks, the fallback one query at a time, as the published "
        "evaluation (use it for both runs to compare speedups with the paper)",
    )
    p.add_argument(
        "--speculation",
        choices=["after_judge", "parallel"],
        default=None,
        help="after_judge: draft after the judge says tool-free (the paper's funnel); parallel: "
        "draft while the judge runs (default: the graph's; see the Throughput guide)",
    )
    p.add_argument("--chunk-size", type=int, default=6, help="queries per chunk (official)")
    p.add_argument(
        "--shuffle-options",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="V*: shuffle the options per query (default; the published evaluation does not, "
        "so its answer is always A)",
    )
    p.add_argument("--limit", type=int, help="only the first N queries")
    p.add_argument(
        "--retry-errors", action="store_true", help="re-run queries whose record has an error"
    )
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_bench, check=check_bench_args)
