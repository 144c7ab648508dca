"""Where an online gate keeps what it has seen: one process's memory, or a LangGraph store
that every worker of a deployment shares.

An :class:`Observation` is one query as the gate saw it: when it met the gate, its draft's
score, whether it was accepted and shadowed, and its label once known. Each is written
under a key of its own (the run's id), so

- writes are atomic and never read-modify-write: two workers recording at once cannot lose
  each other's observations, and a shadow's label arriving later replaces its query's entry;
- a run an engine redelivers after its worker died writes the same key again: no
  duplicate;
- a worker killed with SIGKILL loses only what it had not written: its queries in flight
  and the labels of its shadow runs still running.

:class:`StoreLedger` keeps a mirror of the last ``window`` observations and reads only what
is new since its last read (``sync``, at most every ``sync_s`` seconds), so a query costs one
``put`` and, now and then, one small ``search``. Stores order ``search`` results differently
(LangGraph's in-memory store by insertion, PostgreSQL by ``updated_at``), so the ledger
orders by the observations' own time and asks only for those at or after a time it has
seen, less a margin for writes that were in flight. Entries that fell out of every worker's
window are deleted by whichever worker reads them, so the namespace stays about a window
long.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from langgraph.store.base import BaseStore

__all__ = ["GateLedger", "MemoryLedger", "Observation", "StoreLedger"]


@dataclass(frozen=True)
class Observation:
    """One query as the gate saw it."""

    at: float  # when it met the gate (time.time()): orders the window
    score: float | None  # its draft's acceptance score; None: no draft (judged agentic)
    accepted: bool
    shadowed: bool
    disagrees: bool | None  # None: no label (accepted and not shadowed, or shadow pending/failed)


class GateLedger(Protocol):
    """What an :class:`~speceyes_graph.online_gate.OnlineGate` needs of its storage."""

    shared: bool  # other processes write to it too (then ``sync`` reads their writes)

    def record(self, key: str, observation: Observation) -> None: ...

    def recent(self) -> list[Observation]: ...  # the last ``window``, oldest first

    def stale(self) -> bool: ...

    def sync(self) -> bool: ...  # read others' writes; True if anything changed


class _Window:
    """The last ``size`` observations by key, oldest first (a label replacing its query's
    entry keeps that entry's place)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: dict[str, Observation] = {}

    def put(self, key: str, obs: Observation) -> bool:
        if key not in self.items and len(self.items) >= self.size:
            oldest = next(iter(self.items.values()))
            if obs.at < oldest.at:
                return False  # already out of the window (a late shadow label)
        self.items[key] = obs
        return True

    def merge(self, found: dict[str, Observation]) -> list[str]:
        """Add others' observations; returns the keys that fell out of the window."""
        merged = {**self.items, **found}
        ordered = sorted(merged.items(), key=lambda kv: kv[1].at)
        self.items = dict(ordered[-self.size :])
        return [k for k, _ in ordered[: -self.size]] if len(ordered) > self.size else []

    def trim(self) -> None:
        while len(self.items) > self.size:
            del self.items[next(iter(self.items))]


class MemoryLedger:
    """This process's observations (``graph.batch``/``abatch``, one ``langgraph dev`` worker
    without a store)."""

    shared = False

    def __init__(self, window: int) -> None:
        self._window = _Window(window)
        self._lock = threading.Lock()

    def record(self, key: str, observation: Observation) -> None:
        with self._lock:
            if self._window.put(key, observation):
                self._window.trim()

    def recent(self) -> list[Observation]:
        with self._lock:
            return list(self._window.items.values())

    def stale(self) -> bool:
        return False

    def sync(self) -> bool:
        return False


def _stamp(at: float) -> str:
    """A time as fixed-width text: PostgreSQL's store compares filter values as text."""
    return f"{at:020.6f}"


class StoreLedger(MemoryLedger):
    """Observations in a LangGraph store (``BaseStore``: the deployment's PostgreSQL store
    under Aegra or LangGraph Platform, ``langgraph dev``'s own store), shared by every
    process that names the same ``namespace``.

    Args:
        store: the store (a graph node reads it from ``runtime.store``).
        namespace: the gate's namespace; gates of different graphs need different ones.
        window: observations kept (the gate's window).
        sync_s: how stale the mirror may get before a query reads others' writes.
        margin_s: how far back each read looks again, for writes in flight at the last one.
    """

    shared = True
    PAGE = 500

    def __init__(
        self,
        store: BaseStore,
        namespace: tuple[str, ...],
        window: int,
        *,
        sync_s: float = 1.0,
        margin_s: float = 30.0,
    ) -> None:
        super().__init__(window)
        self.store, self.namespace = store, tuple(namespace)
        self.sync_s, self.margin_s = sync_s, margin_s
        self._synced_at = 0.0  # wall time of the last read
        self._seen_until: float | None = None  # latest observation time read so far
        self._sync_lock = threading.Lock()

    def record(self, key: str, observation: Observation) -> None:
        value: dict[str, Any] = {**asdict(observation), "t": _stamp(observation.at)}
        self.store.put(self.namespace, key, value, index=False)  # first: a failed put raises
        super().record(key, observation)

    def stale(self) -> bool:
        return time.time() - self._synced_at >= self.sync_s

    def sync(self) -> bool:
        """Read what was written since the last read (all of it the first time)."""
        if not self._sync_lock.acquire(blocking=False):
            return False  # another thread of this process is reading
        try:
            started = time.time()
            since = None if self._seen_until is None else self._seen_until - self.margin_s
            found: dict[str, Observation] = {}
            offset = 0
            while True:
                page = self.store.search(
                    self.namespace,
                    filter=None if since is None else {"t": {"$gte": _stamp(since)}},
                    limit=self.PAGE,
                    offset=offset,
                )
                for item in page:
                    obs = _observation(item.value)
                    if obs is not None:
                        found[item.key] = obs
                if len(page) < self.PAGE:
                    break
                offset += self.PAGE
            with self._lock:
                before = dict(self._window.items)
                fell_out = self._window.merge(found)
                changed = self._window.items != before
            if found:
                latest = max(o.at for o in found.values())
                self._seen_until = max(latest, self._seen_until or latest)
            elif self._seen_until is None:
                self._seen_until = started - self.margin_s
            self._synced_at = started
            for key in fell_out[: self.PAGE]:  # no worker's window holds these any more
                if key in found:
                    self.store.delete(self.namespace, key)
            return changed
        finally:
            self._sync_lock.release()


def _observation(value: Any) -> Observation | None:
    """An entry as stored, checked: anything else in the namespace is ignored."""
    try:
        score = value["score"]
        disagrees = value["disagrees"]
        return Observation(
            at=float(value["at"]),
            score=None if score is None else float(score),
            accepted=bool(value["accepted"]),
            shadowed=bool(value["shadowed"]),
            disagrees=None if disagrees is None else bool(disagrees),
        )
    except (KeyError, TypeError, ValueError):
        return None
