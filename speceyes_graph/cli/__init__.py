"""The ``speceyes`` command line: every subcommand is a thin shell over a library call.

One module per command family, each adding its subcommands to the parser
(``add_commands``): ``demo``, ``bench``, ``calibrate`` (and report), ``official``
(import-official), ``online`` (replay-online), ``graph`` (and the example), ``serve``.
"""

from __future__ import annotations

import argparse
import sys

from . import bench, calibrate, demo, graph, official, online, serve

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
  speceyes import-official vstar_*_DeepEyes-7B_Qwen3-VL-2B-Instruct_6_min_0.98.jsonl --out runs/official
  speceyes replay-online runs/vstar runs/hr4k --max-risk 0.02 --shadow-rate 0.1 --plot online.png
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
    for family in (graph, demo, bench, calibrate, official, online, serve):
        family.add_commands(sub)
    return parser


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
    from ..models.served import ServedModelError
    from ..models.servers import EngineNotInstalled

    if args.func in (demo.cmd_demo, bench.cmd_bench):
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
