"""Progress bars that stay readable wherever their output goes.

On a terminal a tqdm bar redraws in place. Written to a file or a pipe (CI logs, ``nohup``,
``| tee``), every redraw is kept: tens of KB of carriage-return-separated bars per run, and
cursor movements for stacked bars. There each bar instead writes one plain line at most
every :data:`LOG_INTERVAL_S` seconds, and a last one when it closes. ``TQDM_DISABLE=1``
turns them all off (tqdm reads ``TQDM_*`` variables for any of its settings).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LOG_INTERVAL_S", "progress_bar"]

LOG_INTERVAL_S = 10.0


class _Lines:
    """A stream for tqdm that turns each redraw into a line of its own."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and not line.startswith("\x1b"):  # cursor movements are for terminals
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Any = None, **kwargs: Any):
    """A ``tqdm`` bar (same arguments), plain lines every few seconds when not on a terminal."""
    from tqdm import tqdm

    class LogBar(tqdm):
        _time: Callable[[], float]  # tqdm's clock (a class attribute); its stubs leave it out

        def refresh(self, *args: Any, **kw: Any) -> None:
            # set_postfix / set_description redraw at once; in a log only the clock does
            # (update() calls this when mininterval has passed; close() draws the last line)
            last = getattr(self, "last_print_t", None)  # None: the first draw, in __init__
            if last is None or self._time() - last >= self.mininterval:
                super().refresh(*args, **kw)

    stream = kwargs.pop("file", None) or sys.stderr
    kwargs.pop("dynamic_ncols", None)
    if _is_terminal(stream):
        return tqdm(iterable, file=stream, dynamic_ncols=True, **kwargs)
    kwargs.pop("position", None)  # stacking moves the cursor
    kwargs["mininterval"] = max(kwargs.get("mininterval", 0.0), LOG_INTERVAL_S)
    kwargs.setdefault("maxinterval", kwargs["mininterval"] * 6)
    return LogBar(iterable, file=_Lines(stream), ascii=True, ncols=100, **kwargs)
