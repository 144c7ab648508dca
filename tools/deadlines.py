"""Deadlines that follow a query across threads.

A query has one absolute deadline (``time.time()`` seconds, so it survives a checkpoint
and a resume in another process). It travels in a context variable, which LangGraph and
LangChain copy into the threads they run nodes, tools and model calls in, so an image
fetch, a decode waiting for memory, or a model call deep inside the agent loop all see the
time their query has left without any argument threading.

:func:`call_with_deadline` bounds calls that cannot be interrupted (a model call that hangs,
a server that never answers): the call runs in a daemon thread with the caller's context and
the caller stops waiting when the time is up. The abandoned thread may run on, but its query
has failed with a clear error and every other query carries on.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "DeadlineExceeded",
    "call_with_deadline",
    "check_deadline",
    "current_deadline",
    "deadline_scope",
    "time_left",
]

T = TypeVar("T")

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "speceyes_deadline", default=None
)


class DeadlineExceeded(TimeoutError):
    """A query, model call, fetch or tool ran out of its time."""


def current_deadline() -> float | None:
    """The absolute deadline (``time.time()``) of the query running in this context, if any."""
    return _DEADLINE.get()


def time_left(cap: float | None = None) -> float | None:
    """Seconds left before the current deadline, at most ``cap``; None when unbounded."""
    at = _DEADLINE.get()
    left = None if at is None else at - time.time()
    if cap is not None:
        left = cap if left is None else min(left, cap)
    return left


@contextmanager
def deadline_scope(at: float | None) -> Iterator[None]:
    """Run the block under deadline ``at`` (absolute), or the enclosing one if that is sooner."""
    outer = _DEADLINE.get()
    effective = at if outer is None else (outer if at is None else min(at, outer))
    token = _DEADLINE.set(effective)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline(what: str) -> None:
    """Raise :class:`DeadlineExceeded` if the current deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise DeadlineExceeded(f"{what}: the query's deadline passed")


def call_with_deadline(
    fn: Callable[..., T], *args: Any, timeout: float | None, what: str, **kwargs: Any
) -> T:
    """``fn(*args, **kwargs)``, but give up after ``timeout`` seconds (or the query's deadline).

    The call runs in a daemon thread with a copy of the caller's context (LangChain callbacks,
    LangGraph config and stream writer, the deadline), so tracing and streaming are unchanged.
    """
    query_left = time_left()
    limit = time_left(timeout)
    if limit is None:
        return fn(*args, **kwargs)
    if limit <= 0:
        raise DeadlineExceeded(f"{what}: the query's deadline passed")
    query_bound = query_left is not None and (timeout is None or query_left < timeout)
    future: Future = Future()
    ctx = contextvars.copy_context()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            with deadline_scope(time.time() + limit):
                result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the waiting caller
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=ctx.run, args=(run,), name=f"deadline:{what}", daemon=True).start()
    try:
        return future.result(timeout=limit)
    except FutureTimeout:
        if future.done():
            raise  # the call itself raised a TimeoutError: report it as it is
        future.cancel()
        if query_bound:
            raise DeadlineExceeded(f"the query's deadline passed during the {what}") from None
        raise DeadlineExceeded(f"{what} took longer than {limit:.3g} s") from None
