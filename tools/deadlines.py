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
:func:`acall_with_deadline` is the same for ``await``: no thread, and the awaited call is
cancelled when the time is up.

The module runs work on two thread pools, kept apart because their jobs pull opposite ways:

- the *call threads* (:class:`_CallThreads`, ``_CALL_THREADS``; threads named
  ``speceyes-call``) run calls that may hang and be abandoned: :func:`call_with_deadline`'s
  bounded calls and :func:`start_in_background`'s work (a sync graph's steps beside a node).
  Unbounded: every call gets an idle thread or a new one at once, never a queue, so no call
  waits behind a hung one; a hung call just keeps its thread. At most 64 idle ones are kept.
- the *offload pool* (:class:`_OldestFirstPool`, ``_OFFLOAD_POOL``; threads named
  ``speceyes-worker``) runs the async path's blocking work through :func:`to_worker_thread`
  (image decodes and resizes, request preparation, sync tools): this package's
  ``asyncio.to_thread``. Bounded like asyncio's default executor (``min(32, CPUs + 4)``
  workers, started on demand), with the queued work taken earliest query deadline first.

One pool cannot do both: calls that hang would fill a bounded pool and stall every query,
and an unbounded pool would start a thread per decode and run them in any order.
(:func:`cpu_work` is no pool: a gate of CPU-count-minus-one slots that threads of either
pool, or the caller's own, wait at before CPU-heavy work.)
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "DeadlineExceeded",
    "EarliestDeadlineFirst",
    "acall_with_deadline",
    "cpu_work",
    "call_with_deadline",
    "check_deadline",
    "current_deadline",
    "deadline_scope",
    "query_deadline",
    "start_in_background",
    "time_left",
    "to_worker_thread",
]

T = TypeVar("T")

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "speceyes_deadline", default=None
)
_OUTERMOST: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "speceyes_query_deadline", default=None
)


# what a worker thread is handed: the caller's context and the call to run in it
_Job = tuple[contextvars.Context, Callable[[], None]]


class _CallThreads:
    """The call threads (see the module docstring): reusable daemon threads for calls that
    may hang. A hung call keeps its thread, everyone else gets an idle one or a new one (never
    blocked behind it), and a hung thread never holds up process exit. Threads are reused,
    not started per call, because starting one costs about a millisecond here, which would
    double the graph's own overhead per query; at most ``max_idle`` idle ones are kept."""

    def __init__(self, max_idle: int = 64):
        self.max_idle = max_idle
        self._idle: list[queue.SimpleQueue[_Job]] = []
        self._lock = threading.Lock()

    def run(self, ctx: contextvars.Context, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._work, args=(inbox,), name="speceyes-call", daemon=True
            ).start()
        inbox.put((ctx, job))

    def _work(self, inbox: queue.SimpleQueue[_Job]) -> None:
        while True:
            ctx, job = inbox.get()
            ctx.run(job)
            with self._lock:
                if len(self._idle) >= self.max_idle:
                    return
                self._idle.append(inbox)


# Pool 1, the call threads: calls that may hang (call_with_deadline, start_in_background).
# Unbounded (a thread per concurrent call, never a queue); keeps at most 64 idle threads.
_CALL_THREADS = _CallThreads()


def start_in_background(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """Run ``fn(*args, **kwargs)`` on a reusable daemon thread, in a copy of the caller's
    context (deadline, callbacks, tracing); the future holds its result or error."""
    future: Future[T] = Future()
    ctx = contextvars.copy_context()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to whoever collects the future
            future.set_exception(exc)
        else:
            future.set_result(result)

    _CALL_THREADS.run(ctx, run)
    return future


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
    first = _OUTERMOST.set(effective) if _OUTERMOST.get() is None else None
    try:
        yield
    finally:
        if first is not None:
            _OUTERMOST.reset(first)
        _DEADLINE.reset(token)


def query_deadline() -> float | None:
    """The outermost deadline in this context: the query's, when a graph node set it (a model
    call's own timeout only tightens :func:`current_deadline`). Work is ordered by it."""
    return _OUTERMOST.get()


def check_deadline(what: str) -> None:
    """Raise :class:`DeadlineExceeded` if the current deadline has passed."""
    left = time_left()
    if left is not None and left <= 0:
        raise DeadlineExceeded(f"{what}: the query's deadline passed")


def call_with_deadline(
    fn: Callable[..., T],
    *args: Any,
    timeout: float | None,
    what: str,
    inline: bool = False,
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)``, but give up after ``timeout`` seconds (or the query's deadline).

    ``inline=True`` is for callees that honour the deadline themselves (``ChatTransformersVLM``
    stops waiting for its batch and drops the request): they run in the caller's thread under
    the tighter deadline, saving the thread hop.

    The call runs in a (reused) daemon thread with a copy of the caller's context (LangChain
    callbacks, LangGraph config and stream writer, the deadline), so tracing and streaming
    are unchanged.
    """
    query_left = time_left()
    limit = time_left(timeout)
    if limit is None:
        return fn(*args, **kwargs)
    if limit <= 0:
        raise DeadlineExceeded(f"{what}: the query's deadline passed")
    query_bound = query_left is not None and (timeout is None or query_left < timeout)
    if inline:
        with deadline_scope(time.time() + limit):
            return fn(*args, **kwargs)

    def bounded() -> T:
        with deadline_scope(time.time() + limit):
            return fn(*args, **kwargs)

    future = start_in_background(bounded)
    try:
        return future.result(timeout=limit)
    except FutureTimeout:
        if future.done():
            raise  # the call itself raised a TimeoutError: report it as it is
        future.cancel()
        if query_bound:
            raise DeadlineExceeded(f"the query's deadline passed during the {what}") from None
        raise DeadlineExceeded(f"{what} took longer than {limit:.3g} s") from None


async def acall_with_deadline(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    timeout: float | None,
    what: str,
    inline: bool = False,
    **kwargs: Any,
) -> T:
    """``await fn(*args, **kwargs)`` within ``timeout`` seconds (or the query's deadline):
    the asynchronous :func:`call_with_deadline`. No thread: the awaited call is cancelled
    when the time is up (an HTTP request is closed, a queued local request dropped), so an
    abandoned call leaves nothing running. ``inline=True``: the callee honours the deadline
    itself and is awaited under it, as in the synchronous form."""
    query_left = time_left()
    limit = time_left(timeout)
    if limit is None:
        return await fn(*args, **kwargs)
    if limit <= 0:
        raise DeadlineExceeded(f"{what}: the query's deadline passed")
    query_bound = query_left is not None and (timeout is None or query_left < timeout)
    with deadline_scope(time.time() + limit):
        if inline:
            return await fn(*args, **kwargs)
        if sys.version_info >= (3, 11):
            scope = asyncio.timeout(limit)
            try:
                async with scope:
                    return await fn(*args, **kwargs)
            except TimeoutError:
                if not scope.expired():
                    raise  # the call itself raised a TimeoutError: report it as it is
        else:
            # Python 3.10 has no asyncio.timeout: the call runs as a task (which copies the
            # deadline scope's context), cancelled when the time is up or the caller is
            task = asyncio.ensure_future(fn(*args, **kwargs))
            try:
                done, _ = await asyncio.wait({task}, timeout=limit)
            except BaseException:
                task.cancel()
                raise
            if done:
                return task.result()  # the call's own result or exception, as it is
            task.cancel()
            await asyncio.wait({task})  # let it clean up, as asyncio.timeout would
        if query_bound:
            raise DeadlineExceeded(f"the query's deadline passed during the {what}") from None
        raise DeadlineExceeded(f"{what} took longer than {limit:.3g} s") from None


class EarliestDeadlineFirst:
    """At most ``slots`` holders at once; waiters are admitted earliest deadline first.

    When ``graph.batch`` starts 64 queries together, a plain lock or semaphore admits their
    image decodes and request preparations in any order, so all 64 finish each stage at about
    the same time and the first ``generate`` waits for the last preparation. Admitting the
    query with the earliest deadline (the one that started first, since deadlines are start +
    timeout) lets the first batch start after a quarter of the work, with the rest prepared
    while it runs. A waiter gives up at its own deadline. Reentrant: work nested in work
    (a request preparation that has to decode an image) runs in the slot it already holds.
    """

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self._held = 0
        self._waiting: list[tuple[float, int, threading.Event]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._held_here = threading.local()  # nested use in one thread takes no second slot

    @contextmanager
    def __call__(self, what: str = "work") -> Iterator[None]:
        if getattr(self._held_here, "depth", 0):  # reentrant: the thread already has a slot
            yield
            return
        self._acquire(what)
        self._held_here.depth = 1
        try:
            yield
        finally:
            self._held_here.depth = 0
            with self._lock:
                self._hand_over()

    def _acquire(self, what: str) -> None:
        with self._lock:
            if self._held < self.slots and not self._waiting:
                self._held += 1
                return
            deadline = query_deadline()  # the query's: its oldest work goes first, any stage
            granted = threading.Event()
            entry = (float("inf") if deadline is None else deadline, next(self._order), granted)
            heapq.heappush(self._waiting, entry)
        if granted.wait(time_left()):
            return
        with self._lock:
            if granted.is_set():  # granted just as we gave up: pass the slot on
                self._hand_over()
            else:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
        raise DeadlineExceeded(f"{what}: the query's deadline passed while waiting for a turn")

    def _hand_over(self) -> None:
        """Release one slot (lock held): straight to the most urgent waiter, if any."""
        if self._waiting:
            heapq.heappop(self._waiting)[2].set()
        else:
            self._held -= 1


class _OldestFirstPool:
    """The offload pool (see the module docstring): a few worker threads that take queued
    blocking work earliest query deadline first; never given calls that may hang.

    ``asyncio.to_thread`` queues on the event loop's default executor, first come first
    served. Under ``graph.abatch`` of 64 queries that order is breadth-first: the 64 image
    decodes are queued before the first query's request preparation, which is queued before
    its processor, so the first batch waits for every decode (0.5 s of the 0.9 s the demo's
    speculation phase took). Taking the oldest query's work first, at every stage, is what
    :class:`EarliestDeadlineFirst` does for threads that already wait; this does it for
    work that has not got a thread yet."""

    def __init__(self, max_workers: int):
        self.max_workers = max_workers
        self._jobs: list[tuple[float, int, contextvars.Context, Callable[[], None]]] = []
        self._order = itertools.count()
        self._threads = 0
        self._idle = 0  # threads waiting for work and not yet woken for any
        self._lock = threading.Lock()
        self._work_queued = threading.Condition(self._lock)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a worker in a copy of the caller's context, ordered by the
        caller's query deadline (no deadline: after every query that has one, in turn)."""
        future: Future[T] = Future()
        deadline = query_deadline()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the awaiting task was cancelled before a worker got to it
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        entry = (float("inf") if deadline is None else deadline, next(self._order))
        with self._lock:
            heapq.heappush(self._jobs, (*entry, contextvars.copy_context(), job))
            if self._idle:
                self._idle -= 1
                self._work_queued.notify()
            elif self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(target=self._work, name="speceyes-worker", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._idle += 1
                    self._work_queued.wait()
                *_, ctx, job = heapq.heappop(self._jobs)
            ctx.run(job)


# Pool 2, the offload pool: the async path's blocking work (to_worker_thread), oldest query
# first. Bounded: min(32, CPUs + 4) workers, as asyncio's default executor; made on first use.
_OFFLOAD_POOL: _OldestFirstPool | None = None
_OFFLOAD_POOL_LOCK = threading.Lock()


async def to_worker_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread``, but on the offload pool, where the oldest query's work goes
    first (see :class:`_OldestFirstPool`): as many workers as the default executor has, the
    context (deadline, callbacks, tracing) carried as ``to_thread`` carries it. For blocking
    work that ends; a call that may hang belongs in :func:`call_with_deadline`."""
    global _OFFLOAD_POOL
    if _OFFLOAD_POOL is None:
        with _OFFLOAD_POOL_LOCK:
            if _OFFLOAD_POOL is None:
                _OFFLOAD_POOL = _OldestFirstPool(min(32, (os.cpu_count() or 1) + 4))
    return await asyncio.wrap_future(_OFFLOAD_POOL.submit(fn, *args))


_CPU_WORK: EarliestDeadlineFirst | None = None
_CPU_WORK_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: workers, idle inboxes and slots
    held by them would wait forever (servers that fork workers after importing the graph)."""
    global _CALL_THREADS, _OFFLOAD_POOL, _OFFLOAD_POOL_LOCK, _CPU_WORK, _CPU_WORK_LOCK
    _CALL_THREADS, _OFFLOAD_POOL, _CPU_WORK = _CallThreads(), None, None
    _OFFLOAD_POOL_LOCK, _CPU_WORK_LOCK = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


def cpu_work() -> EarliestDeadlineFirst:
    """The process-wide gate for CPU-heavy per-query work (image decodes and resizes, model
    request preparation): a slot per CPU but one, earliest deadline first. One gate for every
    stage, so an older query's model request goes before a newer query's image decode; the
    spare CPU keeps the models' batch workers (the Python of their decode loops) fed
    (docs/throughput.md, "The ceiling ratio": one slot fewer than CPUs against as many)."""
    global _CPU_WORK
    with _CPU_WORK_LOCK:
        if _CPU_WORK is None:
            _CPU_WORK = EarliestDeadlineFirst(max(1, (os.cpu_count() or 1) - 1))
        return _CPU_WORK
