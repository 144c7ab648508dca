"""The ``speceyes`` command line: every subcommand is a thin shell over a library call."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import Mode


def _placeholder_graph(mode: Mode, tools: str):
    """A graph with scripted models, for drawing only (drawing needs no weights)."""
    from .demo.example import make_example_models
    from .graph import create_speceyes_graph

    judge, speculator, agent = make_example_models()
    return create_speceyes_graph(  # only the models the mode uses, so only its nodes are drawn
        judge=judge if mode == "speceyes" else None,
        speculator=speculator if mode != "agent" else None,
        agent=agent if mode != "small" else None,
        mode=mode,
        tools=tools,
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
    from .demo.example import run_example

    results = run_example(Path(args.dir) if args.dir else None)
    failed = [r for r in results if r.get("error")]
    return 1 if failed else 0


def cmd_make_tiny_models(args: argparse.Namespace) -> int:
    from .demo.tiny import make_tiny_models

    paths = make_tiny_models(args.dir, seed=args.seed)
    for kind, path in paths.items():
        size = sum(f.stat().st_size for f in Path(path).iterdir()) / 2**20
        print(f"{kind}: {path} ({size:.1f} MiB)")
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from .benchmarks.synthetic import generate_suite

    generate_suite(
        args.dir, args.n, seed=args.seed, zoom_fraction=args.zoom_fraction, max_side=args.max_side
    )
    print(f"wrote {args.n} queries to {args.dir}")
    return 0


def check_bench_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument checked before anything loads, with a message that says what to do."""
    from .models.specs import SpecError, parse_model_spec

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
    if args.gate:
        try:
            from .separability import GateConfig

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
    from .models.specs import ModelSpec, load_chat_model

    if spec.kind == "demo":
        from .demo import demo_checkpoints

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
    from .benchmarks import load_benchmark, run_benchmark
    from .benchmarks.datasets import count_benchmark
    from .benchmarks.runner import RunLocked
    from .graph import create_speceyes_graph
    from .separability import GateConfig

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
    settings: dict = {"max_agent_steps": args.max_agent_steps, "tools": args.tools}
    if all(spec.kind == "demo" for spec in specs.values()):
        from .demo import DEMO_GRAPH_SETTINGS

        settings.update(DEMO_GRAPH_SETTINGS)  # the prompts the demo checkpoints learned
    settings["gate"] = gate
    if args.tools == "thyme" and "prompts" not in settings:
        from .prompts import Prompts

        # the published Thyme runs end POPE's yes/no questions with this line
        tail = "Please answer 'yes' or 'no'." if args.benchmark == "pope" else ""
        settings["prompts"] = Prompts.thyme(open_tail=tail)
    if args.speculation:
        settings["speculation"] = args.speculation
    if args.speculation_depth:
        settings["speculation_depth"] = args.speculation_depth
        settings["speculator_step_tokens"] = args.max_new_tokens
    builder = create_speceyes_graph(speculator=small, agent=large, mode=args.mode, **settings)
    graph = builder.compile()
    schedule = None
    if args.schedule == "official":
        from .benchmarks.schedule import OfficialSchedule

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


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .benchmarks.runner import read_records
    from .calibration import calibrate

    records = read_records(args.dir)
    if not records:
        print(f"speceyes calibrate: no records in {args.dir}", file=sys.stderr)
        return 2
    if args.unlabelled:
        return _calibrate_unlabelled(args, records)
    if args.max_drop is None:
        print("speceyes calibrate: --max-drop EPS is needed (or --unlabelled)", file=sys.stderr)
        return 2
    baseline = read_records(args.baseline) if args.baseline else None
    result = calibrate(
        records,
        max_drop=args.max_drop,
        delta=args.delta,
        baseline=baseline,
        aggregations=args.aggregations.split(","),
        holdout=args.holdout,
    )
    out = Path(args.out or Path(args.dir) / "gate.json")
    result.save(out)
    cal, held = result.calibration, result.holdout
    assert result.delta is not None  # calibrate() keeps its delta (only label-free has none)
    print(
        f"tau {result.tau:.6g} ({result.aggregation}, K {result.k}): with probability >= "
        f"{1 - result.delta:.3g}, accepted drafts cost at most {result.max_drop:.3g} accuracy "
        f"({result.loss}; {result.method}; {result.n_calibration} calibration queries)"
    )
    print(f"calibration: accepts {cal['accepted']:.3f} of queries, observed loss {cal['risk']:.4f}")
    if held:
        line = f"held out ({held['n']} queries): accepts {held['accepted']:.3f}, observed loss {held['risk']:.4f}"
        if "accuracy_with_gate" in held:
            line += f", accuracy {held['accuracy_with_gate']:.3f} vs agent-only {held['agent_accuracy']:.3f}"
        print(line)
    if result.tau >= 1.0:
        print("no tau could be certified at this level: the gate file accepts no draft")
    if result.tau_depth is not None:
        dc = result.depth_calibration
        print(
            f"tau_depth {result.tau_depth:.6g} (the answers after the small model's tool steps, "
            f"same guarantee): accepts {dc['accepted']:.3f} of queries, observed loss {dc['risk']:.4f}"
        )
    print(f"wrote {out} (use: speceyes bench --gate {out}, or create_speceyes_graph(gate=...))")
    return 0


def _calibrate_unlabelled(args: argparse.Namespace, records: list[dict]) -> int:
    from .label_free import NotBimodal, calibrate_unlabelled

    aggregation = args.aggregations.split(",")[0]
    try:
        result = calibrate_unlabelled(
            records,
            aggregation=aggregation,
            posterior=args.posterior,
            target_acceptance=args.target_acceptance,
        )
    except NotBimodal as exc:
        print(f"speceyes calibrate --unlabelled: refused: {exc}", file=sys.stderr)
        return 3
    out = Path(args.out or Path(args.dir) / "gate.json")
    result.save(out)
    fit, cal = result.mixture, result.calibration
    (w1, w2), (m1, m2), (s1, s2) = fit["weights"], fit["means"], fit["sds"]
    print(
        f"two-component fit of {fit['n']} drafts' separability ({aggregation}): "
        f"lower {w1:.0%} at {m1:.2f} +- {s1:.2f}, upper {w2:.0%} at {m2:.2f} +- {s2:.2f} "
        f"(BIC gain {fit['delta_bic']:.1f}, Ashman's D {fit['ashman_d']:.2f})"
    )
    modelled = cal["modelled_accuracy_of_accepted"]
    print(
        f"tau {result.tau:.6g} (separability {cal['tau_separability']:.3f}; {result.method}): "
        f"accepts {cal['accepted_of_drafts']:.3f} of drafts"
        + (f", modelled accuracy of those {modelled:.3f}" if modelled is not None else "")
        + ". No labels, no guarantee: check it against a labelled sample when you can"
    )
    if result.tau_depth is not None:
        if "refused" in result.depth_mixture:
            print(f"tau_depth 1.0 (no tool draft accepted): {result.depth_mixture['refused']}")
        else:
            print(
                f"tau_depth {result.tau_depth:.6g}: accepts "
                f"{result.depth_calibration['accepted_of_drafts']:.3f} of tool drafts"
            )
    print(
        f"wrote {out} (use: speceyes bench --gate {out}; watch it: speceyes report RUN --against {out})"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .benchmarks.report import write_report

    judge = None
    if args.judge_model:
        from .models.specs import SpecError, parse_model_spec

        try:
            spec = parse_model_spec(args.judge_model, "judge")
        except SpecError as exc:
            print(f"speceyes report: --judge-model: {exc}", file=sys.stderr)
            return 2
        judge = load_model(spec, "judge", top_logprobs=None, max_new_tokens=16, batch_size=8)
    report = write_report(
        args.dir,
        args.baseline,
        args.out,
        scoring=args.scoring,
        judge=judge,
        compare=args.compare,
        against=args.against,
        drift_level=args.drift_level,
    )
    out = Path(args.out or args.dir)
    print((out / "report.md").read_text())
    print(
        f"wrote {out / 'report.md'}, {out / 'report.json'}"
        + "".join(f", {out / p}" for p in report["plots"])
    )
    for warning in (report.get("drift") or {}).get("warnings", []):
        print(f"speceyes report: warning: {warning}", file=sys.stderr)
    return 0


def cmd_train_demo(args: argparse.Namespace) -> int:
    """Both models train at once, one process and one thread each (better use of 2 cores)."""
    import multiprocessing as mp

    from .demo.training import train_demo

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


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    checkpoints = None
    if args.checkpoints:
        checkpoints = {k: Path(args.checkpoints) / k for k in ("small", "large")}
    if args.n < 1:
        raise SystemExit("speceyes demo: --n must be at least 1")
    if args.depth < 0:
        raise SystemExit("speceyes demo: --depth must be at least 0")
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
    )
    return 1 if summary["errors"] else 0


_DESCRIPTION = """\
SpecEyes (arXiv 2603.23483): a large model judges whether a visual question needs its
zoom-and-look tools; the ones that do not get a small model's answer at once, kept only if
its answer separability clears tau; the rest run the large model's tool loop."""

_EXAMPLES = """\
examples:
  speceyes demo                   SpecEyes vs the agent on the shipped checkpoints, offline
  speceyes synth data/synth --n 200
  speceyes bench --benchmark vstar --data vstar_bench/ --large SPEC --mode agent --out runs/agent
  speceyes bench ... --small SPEC --mode speceyes --out runs/speceyes
  speceyes report runs/speceyes --baseline runs/agent
  speceyes graph --format png -o workflow.png

'speceyes COMMAND --help' lists each command's options."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speceyes",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("graph", help="draw the workflow (subgraph expanded)")
    p.add_argument("--format", choices=["mermaid", "ascii", "png", "dot"], default="mermaid")
    p.add_argument(
        "--mode", choices=["speceyes", "agent", "small", "specreason"], default="speceyes"
    )
    p.add_argument("--tools", default="deepeyes", help="toolset name or TOML/YAML file")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_graph)

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

    p = sub.add_parser(
        "calibrate",
        help="choose tau from a labelled run so accepted drafts cost at most EPS accuracy, "
        "with probability at least 1-DELTA",
    )
    p.add_argument("dir", help="a run with drafts (--mode small or speceyes)")
    p.add_argument("--max-drop", type=float, help="EPS, e.g. 0.01 (labelled calibration)")
    p.add_argument("--delta", type=float, default=0.1, help="DELTA, e.g. 0.1")
    p.add_argument("--baseline", help="an agent-only run of the same queries (tighter loss)")
    p.add_argument("--aggregations", default="min", help="comma-separated: min,mean,bottom-q")
    p.add_argument("--holdout", type=float, default=0.3, help="share held out to check the gate")
    p.add_argument("--out", help="gate file to write (default: DIR/gate.json)")
    p.add_argument(
        "--unlabelled",
        action="store_true",
        help="no labels: tau from a two-component fit of the drafts' separability (refuses "
        "when it is not clearly bimodal; no guarantee, see the guide Reproducing the paper)",
    )
    p.add_argument(
        "--posterior",
        type=float,
        default=0.5,
        help="--unlabelled: tau where P(upper component | score) reaches this (default 0.5: "
        "where the posteriors cross; higher is stricter)",
    )
    p.add_argument(
        "--target-acceptance",
        type=float,
        help="--unlabelled: tau that accepts this share of the drafts instead",
    )
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("report", help="summarise a run, sweep tau offline against a baseline, plot")
    p.add_argument("dir")
    p.add_argument("--baseline", help="an agent-only run of the same queries")
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="RUN",
        help="other runs of the same queries (small only, SpecReason, ...): a methods table",
    )
    p.add_argument("--out", help="where to write (default: DIR)")
    p.add_argument(
        "--scoring",
        choices=["strict", "official"],
        default="strict",
        help="strict: this package's answer reading (unreadable = wrong); official: the "
        "published matching rules",
    )
    p.add_argument(
        "--judge-model",
        help="an LLM grader for answers the rules cannot decide, with the published grader "
        "prompt (the paper used openai:URL#Qwen/Qwen2.5-72B-Instruct); any model spec",
    )
    p.add_argument(
        "--against",
        metavar="GATEFILE",
        help="a gate file from `speceyes calibrate`: test whether this run's drafts still look "
        "like the calibration ones (Kolmogorov-Smirnov, acceptance) and warn when they moved",
    )
    p.add_argument(
        "--drift-level",
        type=float,
        default=0.01,
        help="--against: warn below this p-value (default 0.01: one false alarm in a hundred "
        "checks of unchanged traffic; lower it for checks that run often)",
    )
    p.set_defaults(func=cmd_report)
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

    return parser


def cmd_serve_config(args: argparse.Namespace) -> int:
    from .deploy import write_server_configs

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
    from .models.servers import SGLangServer, VLLMServer

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


def _only_our_progress() -> None:
    """The demo and the bench print their own progress; transformers' per-load "Loading
    weights" bars (one per checkpoint) read as noise beside it. For this command's process
    only: the library leaves them to the user."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "check"):
        args.check(parser, args)
    from .models.served import ServedModelError
    from .models.servers import EngineNotInstalled

    if args.func in (cmd_demo, cmd_bench):
        _only_our_progress()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ServedModelError, EngineNotInstalled) as exc:  # a server set up wrong: say how
        print(f"speceyes: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
