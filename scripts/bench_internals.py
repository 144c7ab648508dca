"""The small costs the package's shortcuts avoid, each beside the plain way (docs/throughput.md).

Each row is one shortcut a docstring points here for, timed in this process against what
the code would do without it:

- ``content-block types``: langchain-core's ``_get_data_content_block_types`` (asked for each
  image block whenever a chat model's messages are formatted for tracing), computed anew
  against cached (``speceyes_graph._compat.cache_content_block_types``);
- ``model traits``: reading whether a model takes announcements and honours deadlines through
  its bindings (``bind``, ``with_config``) against the graph's lookup (``graph/nodes.py``);
- ``count bound``: the gate's hypergeometric bound on a group's errors
  (``gate/bounds.py``), ours against a bisection over SciPy's ``hypergeom.cdf`` (SciPy has
  no inverse in the group's count); the two must agree;
- ``quarter turn``: an 800x600 RGB image turned upright, OpenCV against numpy's strided copy
  (``speceyes_tools.codec.upright``), beside decoding it from PNG.

Usage: python3 scripts/bench_internals.py [--reps 200]
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import content
from PIL import Image
from scipy.stats import hypergeom

from speceyes_graph import phases
from speceyes_graph.gate.bounds import _most_errors
from speceyes_graph.messages import bare_model


def per_call_us(call: Callable[[], Any], reps: int) -> float:
    """The median of five rounds of ``reps`` calls, per call."""
    call()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        rounds.append((time.perf_counter() - start) / reps * 1e6)
    return sorted(rounds)[2]


def scipy_bound(errors: int, sample: int, population: int, delta: float) -> int:
    lo, hi = errors, population - (sample - errors)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hypergeom.cdf(errors, population, mid, sample) >= delta:
            lo = mid
        else:
            hi = mid - 1
    return lo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    reps = parser.parse_args().reps
    rows = []

    types = content._get_data_content_block_types
    anew = getattr(types, "__wrapped__", types)  # the cache is applied on import
    rows.append(("content-block types", per_call_us(anew, reps), per_call_us(types, reps)))

    model = GenericFakeChatModel(messages=iter(())).bind(stop=["."]).with_config(tags=["x"])
    found: dict[int, tuple[bool, bool]] = {id(model): (False, False)}

    def read_traits() -> tuple[bool, bool]:
        bare = bare_model(model)
        return callable(getattr(bare, "announce", None)), phases.handles_deadlines(bare)

    rows.append(("model traits", per_call_us(read_traits, reps), per_call_us(lambda: found[id(model)], reps)))  # fmt: skip

    ours = _most_errors.__wrapped__  # uncached: the gate asks for new counts as it goes
    for args in ((3, 200, 1000, 0.05), (20, 400, 2000, 0.05)):
        assert ours(*args) == scipy_bound(*args), args
        rows.append(
            (
                f"count bound {args[:3]}",
                per_call_us(lambda a=args: scipy_bound(*a), max(reps // 10, 5)),
                per_call_us(lambda a=args: ours(*a), reps),
            )
        )

    rgb = (np.random.default_rng(0).random((600, 800, 3)) * 255).astype(np.uint8)
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, "PNG")
    turns = reps // 4 or 1
    rows.append(
        (
            "quarter turn, 800x600",
            per_call_us(lambda: np.ascontiguousarray(np.rot90(rgb, -1)), turns),
            per_call_us(lambda: cv2.rotate(rgb, cv2.ROTATE_90_CLOCKWISE), turns),
        )
    )
    decode = per_call_us(lambda: np.asarray(Image.open(io.BytesIO(png.getvalue()))), turns)

    print("| shortcut | plain way (µs a call) | ours (µs a call) | ratio |")
    print("|---|---|---|---|")
    for name, plain, short in rows:
        print(f"| {name} | {plain:.1f} | {short:.2f} | {plain / short:.0f}x |")
    print(f"\n(decoding that 800x600 image from PNG: {decode / 1000:.1f} ms)")


if __name__ == "__main__":
    main()
