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

**A shared store is input from anyone who can reach the server.** So :class:`StoreLedger`
counts only entries it can trust: each is signed by the deployment's key
(:mod:`speceyes_graph.gate.keys`) and checked field by field (:func:`read_entry`: types,
finite numbers, a score in [0, 1], a time not in the future, booleans as booleans); anything
else in the namespace is skipped and counted by reason, and never stops a read. Each read
takes the whole namespace (it stays about a window long: entries that fell out of the
window are deleted by whichever worker reads them), so a worker's window is what a fresh
worker would build from the store: it follows deletions and overwrites too. Entries it has
verified before are not verified again while unchanged (the store's ``updated_at``).

**Health.** A ledger that cannot write, cannot read, or has not read for ``stale_s`` says
so (:meth:`StoreLedger.trouble`); the gate then tightens (see
:class:`~speceyes_graph.gate.online.OnlineGate`) rather than keep a tau it can no longer
justify.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from langgraph.store.base import BaseStore

from .keys import GateKeys

__all__ = [
    "GateLedger",
    "MemoryLedger",
    "Observation",
    "StoreLedger",
    "entry_fields",
    "read_entry",
]

ENTRY_VERSION = 4  # 4: its source; 3: its worker and bound draft; 2: its shadow chance
# (older are skipped)
MIN_CHANCE = 0.01  # a shadow chance below this is not one a gate gives (weights up to 100)
CLOCK_SKEW_S = 300.0  # how far ahead of this worker's clock another's entry may be dated


@dataclass(frozen=True)
class Observation:
    """One query as the gate saw it."""

    at: float  # when it met the gate (time.time()): orders the window
    score: float | None  # its draft's acceptance score; None: no draft (judged agentic)
    accepted: bool
    shadowed: bool
    disagrees: bool | None  # None: no label (accepted and not shadowed, or shadow pending/failed)
    failed: bool = False  # rejected, and the agent was down: counted as disagreeing
    # the chance it was shadowed, drawn before its coin (accepted drafts; 1.0 for the rest,
    # whose label comes with the agent's run): the estimate weighs its label by 1 / chance
    chance: float = 1.0
    by: str = ""  # the worker that wrote it (and runs its shadow): "" in one process
    # a rejected draft's label still to come: a digest of the draft it was decided on, so
    # that the same run redelivered to another worker can label it (that draft alone)
    bound: str = ""
    # who sent the query: a digest of the caller's identity, an open server's burst of
    # traffic ("~" and its minute), or "" in one process; a window holds at most its share
    # of any one source's
    source: str = ""


class GateLedger(Protocol):
    """What an :class:`~speceyes_graph.gate.online.OnlineGate` needs of its storage."""

    shared: bool  # other processes write to it too (then ``sync`` reads their writes)
    skipped: Mapping[str, int]  # entries the last read skipped, by reason

    def record(self, key: str, observation: Observation) -> None: ...

    def recent(self) -> list[Observation]: ...  # the last ``window``, oldest first

    def stale(self) -> bool: ...

    def sync(self) -> bool: ...  # read others' writes; True if anything changed

    def trouble(self) -> str | None: ...  # why its evidence cannot be vouched for now

    def alive(self, worker: str) -> bool: ...  # whether a worker's shadows may still land

    def get(self, key: str) -> Observation | None: ...  # one entry, as stored and checked


class _Window:
    """The last ``size`` observations by key, oldest first (a label replacing its query's
    entry keeps that entry's place), at most ``cap`` of them from any one source (None: no
    cap). A source's entries past its cap make room by dropping its own oldest, never
    another's: one caller's traffic cannot push the others' evidence out."""

    def __init__(self, size: int, cap: int | None = None) -> None:
        self.size, self.cap = size, cap
        self.items: dict[str, Observation] = {}

    def put(self, key: str, obs: Observation) -> bool:
        if key not in self.items and self.cap is not None and obs.source:
            own = [k for k, o in self.items.items() if o.source == obs.source]
            if len(own) >= self.cap:
                if obs.at < self.items[own[0]].at:
                    return False  # older than all it keeps of its source
                del self.items[own[0]]
        if key not in self.items and len(self.items) >= self.size:
            oldest = next(iter(self.items.values()))
            if obs.at < oldest.at:
                return False  # already out of the window (a late shadow label)
        self.items[key] = obs
        return True

    def replace(self, found: dict[str, Observation]) -> list[str]:
        """Become the last ``size`` of ``found`` (each source's last ``cap``); returns the
        keys that fell out."""
        kept: list[tuple[str, Observation]] = []
        fell_out: list[str] = []
        per_source: Counter[str] = Counter()
        for key, obs in sorted(found.items(), key=lambda kv: kv[1].at, reverse=True):
            capped = self.cap is not None and obs.source and per_source[obs.source] >= self.cap
            if len(kept) >= self.size or capped:
                fell_out.append(key)
                continue
            per_source[obs.source] += 1
            kept.append((key, obs))
        self.items = dict(reversed(kept))
        return fell_out

    def trim(self) -> None:
        while len(self.items) > self.size:
            del self.items[next(iter(self.items))]


class MemoryLedger:
    """This process's observations (``graph.batch``/``abatch``, one ``langgraph dev`` worker
    without a store)."""

    shared = False

    def __init__(self, window: int, cap: int | None = None) -> None:
        self._window = _Window(window, cap)
        self._lock = threading.Lock()
        self.skipped: Mapping[str, int] = {}

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

    def trouble(self) -> str | None:
        return None

    def alive(self, worker: str) -> bool:
        return True

    def get(self, key: str) -> Observation | None:
        with self._lock:
            return self._window.items.get(key)


def entry_fields(observation: Observation) -> dict[str, Any]:
    """What an entry holds besides its signature (what the signature covers)."""
    o = observation
    return {
        "v": ENTRY_VERSION,
        "at": float(o.at),
        "score": None if o.score is None else float(o.score),
        "accepted": o.accepted,
        "shadowed": o.shadowed,
        "disagrees": o.disagrees,
        "failed": o.failed,
        "chance": float(o.chance),
        "by": o.by,
        "bound": o.bound,
        "source": o.source,
    }


def read_entry(
    value: object,
    namespace: Sequence[str],
    key: str,
    keys: GateKeys,
    now: float | None = None,
) -> Observation | str:
    """An entry as stored, checked: its observation, or why it is skipped (``"malformed"``,
    ``"unverified"``: not signed by this deployment's key, ``"future"``: dated ahead of this
    worker's clock by more than the skew a fleet's clocks may have)."""
    if not isinstance(value, Mapping) or type(value.get("v")) is not int:  # 1.0, True equal 1
        return "malformed"
    if value["v"] != ENTRY_VERSION:
        return "malformed"
    at, score, chance = (_number(value.get(f)) for f in ("at", "score", "chance"))
    accepted, shadowed, failed = (_flag(value.get(f)) for f in ("accepted", "shadowed", "failed"))
    disagrees = _flag(value.get("disagrees"))
    by, bound, source = (value.get(f) for f in ("by", "bound", "source"))
    if (
        not isinstance(by, str)
        or not isinstance(bound, str)
        or not isinstance(source, str)
        or max(len(by), len(bound), len(source)) > 64
        or at is None
        or chance is None
        or (score is None and value.get("score") is not None)
        or accepted is None
        or shadowed is None
        or failed is None
        or (disagrees is None and value.get("disagrees") is not None)
    ):
        return "malformed"
    observation = Observation(
        at, score, accepted, shadowed, disagrees, failed, chance, by, bound, source
    )
    o = observation
    if (
        o.at <= 0
        or (o.score is not None and not 0.0 <= o.score <= 1.0)
        or (o.shadowed and not o.accepted)
        or (o.accepted and o.score is None)
        or (o.failed and (o.accepted or o.disagrees is not True))
        or not MIN_CHANCE <= o.chance <= 1.0
        or (not o.accepted and o.chance != 1.0)
    ):
        return "malformed"
    if o.at > (time.time() if now is None else now) + CLOCK_SKEW_S:
        return "future"
    if not keys.verify(namespace, key, entry_fields(o), value.get("mac")):
        return "unverified"
    return observation


def _number(x: object) -> float | None:
    """A finite int or float (not a bool, not a string), as a float; else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _flag(x: object) -> bool | None:
    """A bool (not ``"false"``, not 0); else None."""
    return x if type(x) is bool else None


def _beat_of(
    value: object, namespace: Sequence[str], worker: str, keys: GateKeys, now: float
) -> float | None:
    """A worker's signed sign of life: when it was, or None (unsigned, malformed, future)."""
    if not isinstance(value, Mapping) or type(value.get("v")) is not int:
        return None
    at = _number(value.get("at"))
    fields = {"v": value["v"], "at": at}
    if at is None or at > now + CLOCK_SKEW_S or len(worker) > 64:
        return None
    return at if keys.verify(namespace, worker, fields, value.get("mac")) else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class StoreLedger(MemoryLedger):
    """Observations in a LangGraph store (``BaseStore``: the deployment's PostgreSQL store
    under Aegra or LangGraph Platform, ``langgraph dev``'s own store), shared by every
    process that names the same ``namespace`` and holds the same key.

    Args:
        store: the store (a graph node reads it from ``runtime.store``).
        namespace: the gate's namespace; gates of different graphs need different ones.
        window: observations kept (the gate's window).
        keys: the deployment's gate keys (signs what it writes, verifies what it reads).
        sync_s: how stale the mirror may get before a query reads others' writes.
        stale_s: past this long without a successful read, the evidence is not vouched for
            (default ``max(60, 30 * sync_s)``).
        max_entries: a namespace holding more than this (default four windows) is not read
            to the end: the read fails (and the gate tightens) rather than take unbounded
            time, or trust a part of it.
        beat_s: how often a worker signs a sign of life beside its entries (on a read or a
            write, at most this often); a worker silent for three of these is taken for
            dead, and its shadows still in flight stop holding back the fleet's window.
        cap: at most this many of the window's entries from any one source (None: no cap).
    """

    shared = True
    PAGE = 500

    def __init__(
        self,
        store: BaseStore,
        namespace: tuple[str, ...],
        window: int,
        keys: GateKeys,
        *,
        sync_s: float = 1.0,
        stale_s: float | None = None,
        max_entries: int | None = None,
        beat_s: float = 10.0,
        cap: int | None = None,
    ) -> None:
        super().__init__(window, cap)
        self.worker = uuid.uuid4().hex[:16]
        self.beat_s = beat_s
        self._beat_at = 0.0  # when this worker last signed its sign of life
        self._beats: dict[str, float] = {}  # every worker's last sign of life, as last read
        self.store, self.namespace, self.keys = store, tuple(namespace), keys
        self.sync_s = sync_s
        self.stale_s = max(60.0, 30 * sync_s) if stale_s is None else stale_s
        self.max_entries = max_entries or 4 * window + self.PAGE
        self._synced_at = 0.0  # wall time of the last read tried
        self._read_at: float | None = None  # ... and of the last that succeeded
        self._read_error: str | None = None
        self._write_error: str | None = None
        self._verified: dict[str, tuple[object, Observation | str]] = {}
        self._written: dict[str, Observation] | None = None  # recorded while a read runs
        self._sync_lock = threading.Lock()

    @property
    def _workers(self) -> tuple[str, ...]:
        return (*self.namespace, "workers")

    def alive(self, worker: str) -> bool:
        if worker in ("", self.worker):
            return True
        return time.time() - self._beats.get(worker, -math.inf) < 3 * self.beat_s

    def _beat(self) -> None:
        """Sign this worker's sign of life, if due (a failed write: the next one tries)."""
        now = time.time()
        if now - self._beat_at < self.beat_s:
            return
        self._beat_at = now
        fields = {"v": ENTRY_VERSION, "at": now}
        value = {**fields, "mac": self.keys.sign(self._workers, self.worker, fields)}
        try:
            self.store.put(self._workers, self.worker, value, index=False)
        except Exception:
            self._beat_at = 0.0

    def record(self, key: str, observation: Observation) -> None:
        observation = replace(observation, by=self.worker)
        fields = entry_fields(observation)
        value = {**fields, "mac": self.keys.sign(self.namespace, key, fields)}
        try:
            self.store.put(self.namespace, key, value, index=False)  # first: a failed put raises
        except Exception as exc:
            self._write_error = _describe(exc)
            raise
        self._write_error = None
        with self._lock:
            if self._written is not None:
                self._written[key] = observation
            if self._window.put(key, observation):
                self._window.trim()
        self._beat()

    def get(self, key: str) -> Observation | None:
        """The entry under ``key`` as the store holds it now, if it verifies (raises what
        the store raised)."""
        item = self.store.get(self.namespace, key)
        if item is None:
            return None
        checked = read_entry(item.value, self.namespace, key, self.keys)
        return checked if isinstance(checked, Observation) else None

    def stale(self) -> bool:
        return time.time() - self._synced_at >= self.sync_s

    def trouble(self) -> str | None:
        if self._write_error:
            return f"cannot write to the store: {self._write_error}"
        if self._read_error:
            return f"cannot read the store: {self._read_error}"
        if self._read_at is not None and time.time() - self._read_at > self.stale_s:
            return f"last read the store {time.time() - self._read_at:.0f} s ago"
        return None

    def sync(self) -> bool:
        """Read the namespace (every entry: deletions and overwrites show too) and become
        the last ``window`` of what verifies. Raises what the store raised (and says so in
        :meth:`trouble`)."""
        if not self._sync_lock.acquire(blocking=False):
            return False  # another thread of this process is reading
        try:
            started = self._synced_at = time.time()
            with self._lock:
                self._written = {}
            try:
                items = self._read_all()
            except Exception as exc:
                self._read_error = _describe(exc)
                raise
            found, skipped = self._check(items, started)
            with self._lock:
                found.update(self._written or {})  # recorded during the read: may be missing
                before = list(self._window.items.items())
                fell_out = self._window.replace(found)
                changed = list(self._window.items.items()) != before
            self.skipped = dict(skipped)
            self._read_error, self._read_at = None, started
            self._prune(fell_out)
            self._beat()
            return changed
        finally:
            with self._lock:
                self._written = None
            self._sync_lock.release()

    def _read_all(self) -> list[Any]:
        items: list[Any] = []
        while True:
            page = self.store.search(self.namespace, limit=self.PAGE, offset=len(items))
            items.extend(page)
            if len(page) < self.PAGE:
                return items
            if len(items) >= self.max_entries:
                raise RuntimeError(
                    f"the gate's namespace {'.'.join(self.namespace)} holds more than "
                    f"{self.max_entries} entries (its window is {self._window.size}): not "
                    "read; something other than the gate writes there"
                )

    def _check(self, items: list[Any], now: float) -> tuple[dict[str, Observation], Counter[str]]:
        found: dict[str, Observation] = {}
        skipped: Counter[str] = Counter()
        verified: dict[str, tuple[object, Observation | str]] = {}
        beats: dict[str, float] = {}
        for item in items:
            if tuple(item.namespace) == self._workers:
                at = _beat_of(item.value, self._workers, item.key, self.keys, now)
                if at is not None:
                    beats[item.key] = at
                continue
            if tuple(item.namespace) != self.namespace:
                continue  # a deeper namespace under ours: not the gate's
            seen = self._verified.get(item.key)
            updated = getattr(item, "updated_at", None)
            if seen is not None and updated is not None and seen[0] == updated:
                checked = seen[1]
            else:
                checked = read_entry(item.value, self.namespace, item.key, self.keys, now)
            if checked != "future":  # a future entry may become valid: check it again
                verified[item.key] = (updated, checked)
            if isinstance(checked, Observation):
                found[item.key] = checked
            else:
                skipped[checked] += 1
        self._verified = verified
        self._beats = beats
        return found, skipped

    def _prune(self, keys: list[str]) -> None:
        """Delete entries no worker's window holds any more (the oldest valid ones), and the
        signs of life of workers gone for an hour."""
        gone = [w for w, at in self._beats.items() if time.time() - at > 3600]
        doomed = [(self.namespace, k) for k in keys] + [(self._workers, w) for w in gone]
        for namespace, key in doomed[: self.PAGE]:
            try:
                self.store.delete(namespace, key)
            except Exception:  # the next read tries again
                return
