"""Cross-query batching: coalesce concurrent model calls into one batched call.

When ``graph.batch()`` runs N queries, N threads (or tasks) reach the same phase at about
the same time and each calls ``model.invoke``. :class:`BatchScheduler` queues those
requests by *key* (the generation settings: a judge call, a draft, an agent step), and one
worker thread per model drains them: it takes the oldest waiting request, waits up to
``max_wait_s`` for more requests with the same key (up to ``max_batch_size``), and runs
them as one batch. While a batch runs, the next one fills up, so under load batches form
without any waiting at all.

With ``can_join`` (``ChatTransformersVLM`` allows it for greedy requests that differ only
in stop strings, or in length when the joining ones are no longer), waiting requests of
other keys ride along a batch being launched instead of waiting for it to finish and then
running their own: a judge call (10 tokens) joins a batch of agent steps (hundreds), never
the reverse, so no batch runs longer for it.

A caller announces its request (:meth:`BatchScheduler.expect`) as soon as it is called,
before it spends milliseconds preparing it (chat template, image processing). The worker
then waits for announced requests of the key it is filling (up to ``max_expect_s``)
instead of launching a part-full batch and leaving the stragglers a ``generate`` of
their own: with 64 queries prepared by 64 threads, that is the difference between four
calls of 16 and six calls of 16, 15, 14, 16, 2 and 1.

Different models have different schedulers (and worker threads), so the small model's
drafts, the large model's judge calls and agent steps of other queries proceed at the same
time instead of in lockstep phases. One failing request fails only its caller: if a
batched call raises, its requests are retried one by one and only the broken ones fail.

With a token budget (``batch_tokens`` and a :class:`~speceyes_graph.models.memory.TokenBudget`)
a batch also stops growing before its padded token count passes the budget; a request
larger than the budget runs alone. A batch that runs out of memory anyway is split in
halves and retried (each half may split again), and the budget is lowered so the next
batches are formed smaller; a single request that does not fit fails alone, saying so.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from speceyes_tools.deadlines import DeadlineExceeded, time_left

from .memory import TokenBudget, is_out_of_memory, release_cached_memory

__all__ = ["BatchOutOfMemory", "BatchScheduler", "BatchStats", "CancelScope", "RowKeys"]

log = logging.getLogger(__name__)


class CancelScope:
    """Requests submitted by calls made within :meth:`active` can be withdrawn together:
    :meth:`cancel` drops those still queued (they never reach ``generate``; their callers
    get ``CancelledError``). Parallel speculation uses it for drafts the judge made moot."""

    def __init__(self) -> None:
        self.cancelled = False
        self.dropped = 0
        self._futures: list[Future] = []
        self._lock = threading.Lock()

    def add(self, future: Future) -> None:
        with self._lock:
            self._futures.append(future)
            if self.cancelled and future.cancel():
                self.dropped += 1

    def cancel(self) -> bool:
        """Drop every request of this scope that has not started, and any submitted later;
        True if none of them reached the model."""
        with self._lock:
            self.cancelled = True
            self.dropped += sum(f.cancel() for f in self._futures)
            return all(f.cancelled() for f in self._futures)

    @contextmanager
    def active(self) -> Iterator[CancelScope]:
        token = _CANCEL_SCOPE.set(self)
        try:
            yield self
        finally:
            _CANCEL_SCOPE.reset(token)


_CANCEL_SCOPE: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar(
    "speceyes_cancel_scope", default=None
)


class RowKeys(tuple):
    """The key of a batch whose requests have different (compatible) keys: one per row."""


class BatchOutOfMemory(MemoryError):
    """One request ran out of memory on its own: it fails; the others go on."""


@dataclass
class _Request:
    key: Hashable
    payload: Any
    future: Future
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class BatchStats:
    """What the scheduler did: how many batched calls, of which sizes, how many ran out of
    memory, and how the token budget moved (``budget_cuts``: (from, to) each time)."""

    calls: int = 0
    requests: int = 0
    sizes: Counter = field(default_factory=Counter)
    retried_alone: int = 0
    out_of_memory: int = 0  # batched calls that ran out of memory
    split: int = 0  # of those, split in halves and retried
    max_tokens: int = 0  # the largest batch, in padded tokens (with a budget)
    max_batch_tokens: int | None = None  # the budget now
    budget_cuts: list = field(default_factory=list)
    busy_s: float = 0.0  # inside run_batch
    queued_s: float = 0.0  # summed over requests: submit to the start of their batch

    @property
    def mean_batch(self) -> float:
        return self.requests / self.calls if self.calls else 0.0

    @property
    def mean_queued_s(self) -> float:
        return self.queued_s / self.requests if self.requests else 0.0


class BatchScheduler:
    """Runs ``run_batch(key, payloads) -> results`` on coalesced requests in a worker thread.

    ``run_batch`` returns one result per payload, in order; an item may be an ``Exception``
    instance, which fails only that request. ``batch_tokens(keys, payloads)``, given with a
    ``budget``, is the padded token count of a would-be batch.
    """

    def __init__(
        self,
        run_batch: Callable[[Hashable, Sequence[Any]], Sequence[Any]],
        *,
        max_batch_size: int = 16,
        max_wait_s: float = 0.005,
        max_expect_s: float = 0.5,
        can_join: Callable[[Hashable, Hashable], bool] | None = None,
        batch_tokens: Callable[[Sequence[Hashable], Sequence[Any]], int] | None = None,
        budget: TokenBudget | None = None,
        name: str = "speceyes-batcher",
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_expect_s = max_expect_s
        self.can_join = can_join
        self.batch_tokens = batch_tokens
        self.budget = budget if batch_tokens is not None else None
        self.stats = BatchStats(max_batch_tokens=self.budget.limit if self.budget else None)
        self._expected: dict[Hashable, list[float]] = {}  # by key: expiry of each announcement
        self._queues: dict[Hashable, deque[_Request]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def expect(self, key: Hashable, n: int = 1, ttl: float | None = None) -> None:
        """Announce ``n`` requests with ``key`` on their way (negative: withdraw ones that
        will not come), so that the worker waits for them (up to ``max_expect_s``) instead
        of only ``max_wait_s``. :meth:`submit` counts an announcement as fulfilled; one
        never fulfilled lapses after ``ttl`` seconds (default ``max_expect_s``), so a caller
        that died between the two cannot hold batches up for longer than that."""
        with self._cond:
            pending = self._expected.setdefault(key, [])
            if n > 0:
                pending.extend([time.monotonic() + (ttl or self.max_expect_s)] * n)
            else:
                del pending[:-n]
            if not pending:
                del self._expected[key]
            self._cond.notify_all()

    def _announced(self, key: Hashable, now: float) -> int:
        """Announcements of ``key`` still valid (lock held); lapsed ones are dropped."""
        pending = self._expected.get(key)
        if not pending:
            return 0
        pending[:] = [t for t in pending if t > now]
        if not pending:
            del self._expected[key]
        return len(pending)

    def submit(self, key: Hashable, payload: Any) -> Future:
        """Queue one request; the future resolves to its result or raises its error."""
        request = _Request(key, payload, Future())
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._queues.setdefault(key, deque()).append(request)
            if self._announced(key, request.enqueued):
                pending = self._expected[key]
                pending.remove(min(pending))
                if not pending:
                    del self._expected[key]
            self._cond.notify_all()
        return request.future

    def submit_many(self, key: Hashable, payloads: Sequence[Any]) -> list[Future]:
        """Queue several requests at once, so they land in the same batch."""
        requests = [_Request(key, p, Future()) for p in payloads]
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._queues.setdefault(key, deque()).extend(requests)
            self._cond.notify_all()
        return [r.future for r in requests]

    def call(self, key: Hashable, payload: Any) -> Any:
        """Submit and wait, at most until the caller's deadline (a queued request is dropped)."""
        future = self.submit(key, payload)
        scope = _CANCEL_SCOPE.get()
        if scope is not None:
            scope.add(future)
        try:
            return future.result(timeout=time_left())
        except FutureTimeout:
            if future.done():
                raise
            future.cancel()
            raise DeadlineExceeded("the deadline passed while waiting for a batch") from None

    async def acall(self, key: Hashable, payload: Any) -> Any:
        """:meth:`call` for a coroutine: awaits the worker (no thread waits); a cancelled
        task drops its request if it is still queued."""
        future = self.submit(key, payload)
        scope = _CANCEL_SCOPE.get()
        if scope is not None:
            scope.add(future)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), time_left())
        except asyncio.TimeoutError:
            future.cancel()
            raise DeadlineExceeded("the deadline passed while waiting for a batch") from None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # --- worker ---------------------------------------------------------------------------

    def _next_batch(self) -> list[_Request] | None:
        """The next batch: a full one if any key has one (overdue requests first, so none
        starves), else the oldest key's once its wait is over."""
        with self._cond:
            while True:
                pending = {k: q for k, q in self._queues.items() if q}
                if not pending:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                now = time.monotonic()
                overdue = [
                    k for k, q in pending.items() if now - q[0].enqueued >= self.max_expect_s
                ]
                full = [  # by count, or by tokens: the waiting requests do not all fit
                    k
                    for k, q in pending.items()
                    if len(q) >= self.max_batch_size or len(self._fit(q)) < len(q)
                ]
                key = min(overdue or full or pending, key=lambda k: pending[k][0].enqueued)
                queue = pending[key]
                wait = self.max_expect_s if self._announced(key, now) else self.max_wait_s
                remaining = queue[0].enqueued + wait - now
                if overdue or full or remaining <= 0 or self._closed:
                    batch = self._fit(queue)
                    for r in batch:
                        queue.remove(r)
                    return batch + self._riders(key, pending, batch)
                self._cond.wait(remaining)

    def _fit(
        self, candidates: Sequence[_Request], batch: Sequence[_Request] = ()
    ) -> list[_Request]:
        """The candidates, in order, that join ``batch`` within the count and the token
        budget; one that would pass the budget is skipped (it leads a later batch). The
        first request of a batch always goes: a request larger than the budget runs alone."""
        chosen = list(batch)
        for looked, r in enumerate(candidates):
            if len(chosen) >= self.max_batch_size or looked >= 4 * self.max_batch_size:
                break  # the scan is bounded: a long queue must not hold the lock long
            if chosen and not self._within_budget([*chosen, r]):
                continue
            chosen.append(r)
        return chosen[len(batch) :]

    def _tokens(self, batch: Sequence[_Request]) -> int:
        """The padded tokens of ``batch``; 0 (it fits) for payloads that cannot be counted,
        which then fail in ``run_batch`` on their own rather than stop the worker here."""
        assert self.batch_tokens is not None
        try:
            return self.batch_tokens([r.key for r in batch], [r.payload for r in batch])
        except Exception:  # noqa: BLE001 - a malformed payload fails its own call later
            return 0

    def _within_budget(self, batch: Sequence[_Request]) -> bool:
        return self.budget is None or self.budget.fits(self._tokens(batch))

    def _riders(self, key: Hashable, pending: dict, batch: list[_Request]) -> list[_Request]:
        """Waiting requests of other keys that may join ``key``'s batch (lock held), oldest
        first: they would otherwise wait for this batch to finish and then run their own."""
        if self.can_join is None or len(batch) >= self.max_batch_size:
            return []
        others = [k for k in pending if k != key and pending[k] and self.can_join(key, k)]
        waiting = sorted((r for k in others for r in pending[k]), key=lambda r: r.enqueued)
        riders = self._fit(waiting, batch)
        for r in riders:
            self._queues[r.key].remove(r)
        return riders

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            batch = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if batch:
                self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        keys = [r.key for r in batch]
        key = keys[0] if len(set(keys)) == 1 else RowKeys(keys)
        started = time.monotonic()
        self.stats.calls += 1
        self.stats.requests += len(batch)
        self.stats.sizes[len(batch)] += 1
        self.stats.queued_s += sum(started - r.enqueued for r in batch)
        tokens = self._tokens(batch) if self.batch_tokens is not None else None
        self.stats.max_tokens = max(self.stats.max_tokens, tokens or 0)
        if self.budget is not None:
            self.stats.max_batch_tokens = self.budget.limit
        failure: Exception | None = None
        try:
            results = list(self.run_batch(key, [r.payload for r in batch]))
            if len(results) != len(batch):
                raise RuntimeError(
                    f"run_batch returned {len(results)} results for {len(batch)} requests"
                )
        except Exception as exc:
            failure = exc
        finally:
            self.stats.busy_s += time.monotonic() - started
        if failure is not None and is_out_of_memory(failure):
            # Retried outside the except block, the failed attempt's traceback (and the
            # activations its frames hold) dropped first: otherwise the retry would run
            # with the memory that ran out still taken.
            message = str(failure)
            failure = None
            self._out_of_memory(batch, tokens, message)
            return
        if failure is not None:
            if len(batch) == 1:
                batch[0].future.set_exception(failure)
                return
            log.warning("batched call of %d failed (%s); retrying one by one", len(batch), failure)
            for r in batch:
                self.stats.retried_alone += 1
                self._run([r])
            return
        for r, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                r.future.set_exception(result)
            else:
                r.future.set_result(result)

    def _out_of_memory(self, batch: list[_Request], tokens: int | None, message: str) -> None:
        """Split a batch that ran out of memory in halves and run each (either may split
        again), after lowering the budget; a request alone fails with ``message``."""
        release_cached_memory()
        self.stats.out_of_memory += 1
        if self.budget is not None and tokens is not None:
            self.budget.cut(tokens, len(batch))
            self.stats.max_batch_tokens = self.budget.limit
            self.stats.budget_cuts = list(self.budget.cuts)
        if len(batch) == 1:
            budget = (
                "" if self.budget is None else f" (max_batch_tokens is now {self.budget.limit:,})"
            )
            batch[0].future.set_exception(
                BatchOutOfMemory(
                    f"{message}; it does not fit on its own{budget}: lower the image resolution "
                    "(the processor's max_pixels), max_tokens, or the images an agent turn "
                    "carries, or use a device with more memory"
                )
            )
            return
        half = len(batch) // 2
        log.warning(
            "batched call of %d (%s tokens) ran out of memory; retrying as %d + %d",
            len(batch), "?" if tokens is None else f"{tokens:,}", half, len(batch) - half,
        )  # fmt: skip
        self.stats.split += 1
        for part in (batch[:half], batch[half:]):
            self._run_within_budget(part)

    def _run_within_budget(self, batch: list[_Request]) -> None:
        """Run ``batch``, halved first as often as the (lowered) budget requires: a part
        known not to fit is not tried."""
        if len(batch) > 1 and self.batch_tokens is not None and not self._within_budget(batch):
            half = len(batch) // 2
            self._run_within_budget(batch[:half])
            self._run_within_budget(batch[half:])
        else:
            self._run(batch)
