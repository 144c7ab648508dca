"""The resumable benchmark runner: one JSON line per query, written as soon as it finishes.

Queries run concurrently (a sliding window of ``concurrency`` in flight, so a batching
backend sees many requests at once) through the compiled graph. Each finished query is
appended to ``records.jsonl`` and flushed at once. On restart the runner reads what is
there, drops a half-written last line (a kill mid-write), sets aside lines that are not
valid records (into ``records.corrupt.jsonl``, reported) without losing the good records
after them, and skips every query already recorded: kill it at any moment (Ctrl-C stops
cleanly), rerun the same command, and the file ends with every query exactly once.

An exclusive lock on the folder keeps a second process from writing the same run, and
``run.json`` (one entry per session: wall time, counts, settings) is replaced atomically.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import put_bytes, release

from .datasets import BenchQuery
from .scoring import is_correct

__all__ = [
    "RECORDS",
    "RecordScan",
    "RunLocked",
    "make_record",
    "read_records",
    "run_benchmark",
    "run_settings",
    "scan_records",
]

RECORDS = "records.jsonl"
CORRUPT = "records.corrupt.jsonl"
log = logging.getLogger(__name__)
_SHORT = {
    "speculative": "spec",
    "speculative-tools": "spec-tools",
    "judged-agentic": "judged",
    "rejected-agentic": "rejected",
    "agent-only": "agent",
    "draft-only": "draft",
}


@dataclass
class RecordScan:
    """What ``records.jsonl`` holds: valid records (first occurrence of each id) and the
    1-based numbers of lines set aside (not JSON, not a record, or a repeated id)."""

    records: list[dict]
    corrupt: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    torn_tail: bool = False


def scan_records(out_dir: str | Path) -> RecordScan:
    path = Path(out_dir) / RECORDS
    if not path.exists():
        return RecordScan([])
    data = path.read_bytes()
    scan = RecordScan([])
    seen: set[str] = set()
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            scan.torn_tail = True  # the process died while writing this line
            break
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            scan.corrupt.append(number)
        elif record["id"] in seen:
            scan.duplicates.append(number)
        else:
            seen.add(record["id"])
            scan.records.append(record)
    return scan


def read_records(out_dir: str | Path, *, repair: bool = False) -> list[dict]:
    """All valid records, each id once. With ``repair``: a half-written last line is cut off
    and bad lines are moved to ``records.corrupt.jsonl`` (the file is replaced atomically)."""
    out = Path(out_dir)
    scan = scan_records(out)
    bad = set(scan.corrupt) | set(scan.duplicates)
    if bad or scan.torn_tail:
        log.warning(
            "%s: set aside %d corrupt and %d repeated lines%s",
            out / RECORDS,
            len(scan.corrupt),
            len(scan.duplicates),
            ", cut a half-written last line" if scan.torn_tail else "",
        )
    if repair and (bad or scan.torn_tail):
        lines = (out / RECORDS).read_bytes().splitlines(keepends=True)
        if bad:
            with (out / CORRUPT).open("ab") as fh:
                fh.writelines(lines[n - 1] for n in sorted(bad))
        _replace(out / RECORDS, b"".join(json.dumps(r).encode() + b"\n" for r in scan.records))
    return scan.records


def run_settings(run_dir: str | Path) -> dict[str, Any]:
    """The settings of a run folder's last session (``run.json``); {} when it has none or the
    file cannot be read."""
    path = Path(run_dir) / "run.json"
    try:
        sessions = json.loads(path.read_text()).get("sessions", []) if path.exists() else []
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return {}
    return dict(sessions[-1].get("settings") or {}) if sessions else {}


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a crash leaves the old or the new file)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunLocked(RuntimeError):
    """Another process is writing to this run folder."""


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    import fcntl

    with (out / ".lock").open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RunLocked(
                f"another process is writing to {out} (it holds {out / '.lock'}); wait for it, "
                "or use another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _load_run(path: Path) -> dict:
    if not path.exists():
        return {"sessions": []}
    try:
        run = json.loads(path.read_text())
        if isinstance(run, dict) and isinstance(run.get("sessions"), list):
            return run
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    log.warning("%s is unreadable; kept as %s.corrupt and started afresh", path, path.name)
    os.replace(path, path.with_name(path.name + ".corrupt"))
    return {"sessions": []}


def make_record(
    q: BenchQuery, out: dict[str, Any] | None, latency: float, error: str | None, mode: str
) -> dict:
    out = out or {}
    draft, tool_draft = out.get("draft"), out.get("tool_draft")
    answer = out.get("answer")
    error = error or out.get("error")
    record = {
        "id": q.id,
        "split": q.split,
        "question": q.question,
        "options": q.options,
        "expected": q.expected,
        "mode": mode,
        "answer": answer,
        "correct": bool(error is None and is_correct(answer, q.expected, q.options)),
        "route": out.get("route"),
        "judge_output": out.get("judge_output"),
        "draft": draft,
        "draft_correct": bool(draft and is_correct(draft.get("text"), q.expected, q.options)),
        "tool_draft": tool_draft,  # depth-D speculation: the small loop's answer
        "tool_draft_correct": bool(
            tool_draft and is_correct(tool_draft.get("text"), q.expected, q.options)
        ),
        "agent_steps": out.get("agent_steps") or [],
        "stop_reason": out.get("stop_reason"),
        "timings": out.get("timings") or {},
        "latency_s": latency,
        "error": error,
        "meta": q.meta,
    }
    return record


def _run_one(graph, q: BenchQuery, mode: str) -> dict:
    ref = None
    t0 = time.perf_counter()
    try:
        ref = q.image if q.image else put_bytes(q.image_bytes()) if q.image_bytes else None
        inputs = {
            "question": q.question,
            "images": [ref] if ref else [],
            "options": q.options,
            "query_id": q.id,
        }
        out = graph.invoke(inputs)
        return make_record(q, out, time.perf_counter() - t0, None, mode)
    except Exception as exc:  # a failure of the graph itself: recorded, never fatal to the run
        return make_record(q, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}", mode)
    finally:
        if ref and is_blob_key(ref):
            release(ref)


def run_benchmark(
    graph,
    queries: Iterable[BenchQuery],
    out_dir: str | Path,
    *,
    mode: str,
    concurrency: int = 16,
    limit: int | None = None,
    retry_errors: bool = False,
    settings: dict[str, Any] | None = None,
    progress: bool = True,
    total: int | None = None,
    schedule: Callable[[list[BenchQuery]], list[dict]] | None = None,
    desc: str | None = None,
) -> dict[str, Any]:
    """Run (or resume) a benchmark; returns this session's summary.

    ``total`` (the number of queries, if known) gives the progress bar its length and ETA;
    ``desc`` its label (default ``bench MODE``).
    On Ctrl-C the queries not yet started are dropped, every finished one is already on
    disk, and the summary says ``interrupted``. By default queries run concurrently
    (``concurrency`` in flight through ``graph.invoke``); ``schedule`` (e.g.
    :class:`~speceyes_graph.benchmarks.schedule.OfficialSchedule`) instead takes chunks of
    ``schedule.chunk_size`` queries, one chunk at a time, and returns their records.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        return _run_locked(
            graph, queries, out, mode, concurrency, limit, retry_errors, settings, progress,
            total, schedule, desc,
        )  # fmt: skip


def _run_locked(
    graph,
    queries,
    out,
    mode,
    concurrency,
    limit,
    retry_errors,
    settings,
    progress,
    total,
    schedule,
    desc=None,
) -> dict[str, Any]:
    existing = read_records(out, repair=True)
    if retry_errors and any(r.get("error") for r in existing):
        existing = [r for r in existing if not r.get("error")]
        _replace(out / RECORDS, b"".join(json.dumps(r).encode() + b"\n" for r in existing))
    done = {r["id"] for r in existing}
    todo = _pending(queries, done, limit)
    if total is not None and limit is not None:
        total = min(total, limit)
    session = {
        "started": time.time(),
        "resumed_with": len(done),
        "settings": settings or {},
        "mode": mode,
    }
    routes: Counter = Counter(r.get("route") or "error" for r in existing)
    n_correct = sum(r["correct"] for r in existing)
    n_total = len(existing)
    bar = None
    if progress:
        from ..progress import progress_bar

        left = max(0, total - len(done)) if total is not None else None
        bar = progress_bar(total=left, desc=desc or f"bench {mode}", unit="q")
    t0 = time.perf_counter()
    written = 0
    interrupted = False
    pool = ThreadPoolExecutor(concurrency)

    def write(record: dict) -> None:
        nonlocal written, n_total, n_correct
        fh.write(json.dumps(record) + "\n")  # only this thread writes: no lock needed
        fh.flush()
        written += 1
        n_total += 1
        n_correct += record["correct"]
        routes[record.get("route") or "error"] += 1
        if bar is not None:
            bar.set_postfix(
                refresh=False,  # the update draws it, when its interval has passed
                acc=f"{n_correct / n_total:.3f}",
                **{_SHORT.get(k, k): v for k, v in routes.items()},
            )
            bar.update(1)

    try:
        with (out / RECORDS).open("a", encoding="utf-8") as fh:
            if schedule is not None:  # chunk after chunk, as the schedule runs them
                while chunk := [
                    q for q in (next(todo, None) for _ in range(schedule.chunk_size)) if q
                ]:
                    for record in schedule(chunk):
                        write(record)
            else:
                in_flight: set[Future] = set()

                def fill() -> None:
                    while len(in_flight) < concurrency:
                        q = next(todo, None)
                        if q is None:
                            return
                        in_flight.add(pool.submit(_run_one, graph, q, mode))

                fill()
                while in_flight:
                    finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        in_flight.discard(fut)
                        write(fut.result())
                    fill()
    except KeyboardInterrupt:
        interrupted = True  # what finished is on disk; what runs is abandoned, not waited for
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
        if bar is not None:
            bar.close()
        session.update(
            finished=time.time(),
            wall_s=time.perf_counter() - t0,
            written=written,
            interrupted=interrupted,
        )
        run = _load_run(out / "run.json")
        run["sessions"].append(session)
        _replace(out / "run.json", json.dumps(run, indent=2).encode())
    return {
        "written": written,
        "total": n_total,
        "accuracy": n_correct / n_total if n_total else 0.0,
        "routes": dict(routes),
        "interrupted": interrupted,
        "wall_s": session["wall_s"],
    }


def _pending(
    queries: Iterable[BenchQuery], done: set[str], limit: int | None
) -> Iterator[BenchQuery]:
    for i, q in enumerate(queries):
        if limit is not None and i >= limit:
            return
        if q.id not in done:
            yield q
