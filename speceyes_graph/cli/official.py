"""``speceyes import-official``: the published scripts' result files as a run folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROUTE_NAMES = {
    "speculative": "draft accepted",
    "rejected-agentic": "draft rejected, agent",
    "judged-agentic": "judge asked for tools, agent",
    "agent-only": "agent only (baseline)",
}


def cmd_import_official(args: argparse.Namespace) -> int:
    from ..benchmarks.official_results import import_official

    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        print(f"speceyes import-official: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        result = import_official(
            args.results,
            args.out,
            benchmark=args.benchmark,
            split=args.split,
            mode="agent" if args.baseline else None,
            aggregation=args.aggregation,
            tau=args.tau,
            data=args.data,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"speceyes import-official: {exc}", file=sys.stderr)
        return 2
    for path in args.results:
        skipped = sum(1 for s in result.skipped if s["file"] == str(path))
        print(f"{path}: {result.imported[str(path)]} lines imported, {skipped} skipped")
    routes = ", ".join(f"{ROUTE_NAMES.get(k, k)} {v}" for k, v in sorted(result.routes.items()))
    print(f"routes: {routes or 'none'}")
    for note, n in sorted(result.notes.items()):
        print(f"note: {n} records: {note}")
    if result.skipped:
        shown = result.skipped[:5]
        for s in shown:
            print(f"skipped {Path(s['file']).name}:{s['line']}: {s['reason']}", file=sys.stderr)
        if len(result.skipped) > len(shown):
            print(f"... and {len(result.skipped) - len(shown)} more", file=sys.stderr)
        print(f"every skipped line and why: {Path(args.out) / 'import-skipped.jsonl'}")
    if not sum(result.imported.values()):
        print("speceyes import-official: no line could be imported", file=sys.stderr)
        return 2
    print(
        f"wrote {Path(args.out)} (next: speceyes report {args.out} [--baseline BASELINE_RUN], "
        f"speceyes calibrate {args.out} --unlabelled)"
    )
    return 0


def add_commands(sub: Any) -> None:
    """Add this family's subcommands to the ``speceyes`` parser."""
    p = sub.add_parser(
        "import-official",
        help="turn result files of the published SpecEyes scripts (DeepEyes or Thyme; V*, "
        "HR-Bench, POPE; SpecEyes or --baseline runs) into a run folder for report and calibrate",
        description="Result files of one run (one per split, e.g. both V* splits) become one "
        "run folder. The benchmark, split, threshold and aggregation are read from the file "
        "names the scripts write; the options below override them.",
    )
    p.add_argument("results", nargs="+", help="the scripts' .jsonl result files of one run")
    p.add_argument("--out", required=True, help="the run folder to write")
    p.add_argument("--benchmark", choices=["vstar", "hr", "pope"], help="if the name does not say")
    p.add_argument("--split", help="if the name does not say (e.g. hr_bench_8k)")
    p.add_argument(
        "--baseline", action="store_true", help="the files are a --baseline run (large model only)"
    )
    p.add_argument(
        "--aggregation",
        choices=["min", "mean", "bottom20", "log"],
        help="the scripts' --mode, if the name does not say",
    )
    p.add_argument(
        "--tau", type=float, help="the scripts' --score_threshold, if the name does not say"
    )
    p.add_argument(
        "--data",
        help="the dataset the run read (V* folder, HR-Bench .tsv/.parquet or folder): recovers "
        "the options of lines that kept no prompt",
    )
    p.set_defaults(func=cmd_import_official)
