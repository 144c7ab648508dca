"""The resumable benchmark runner: one JSON line per query, written as soon as it finishes.

Queries run concurrently (a sliding window of ``concurrency`` in flight, so a batching
backend sees many requests at once) through the compiled graph. Each finished query is
appended to ``records.jsonl`` and flushed at once. On restart the runner reads what is
there, drops a half-written last line (a kill mid-write), and skips every query already
recorded: kill it at any moment, rerun the same command, and the file ends with every
query exactly once. ``run.json`` keeps one entry per session (wall time, counts).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import put_bytes, release

from .datasets import BenchQuery
from .scoring import is_correct

__all__ = ["RECORDS", "read_records", "run_benchmark"]

RECORDS = "records.jsonl"
_SHORT = {
    "speculative": "spec",
    "judged-agentic": "judged",
    "rejected-agentic": "rejected",
    "agent-only": "agent",
    "draft-only": "draft",
}


def read_records(out_dir: str | Path, *, repair: bool = False) -> list[dict]:
    """All complete records; with ``repair``, cut a half-written last line off the file."""
    path = Path(out_dir) / RECORDS
    if not path.exists():
        return []
    data = path.read_bytes()
    records, good_end = [], 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # the process died while writing this line
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good_end += len(line)
    if repair and good_end != len(data):
        with path.open("r+b") as fh:
            fh.truncate(good_end)
    return records


def _record(
    q: BenchQuery, out: dict[str, Any] | None, latency: float, error: str | None, mode: str
) -> dict:
    out = out or {}
    draft = out.get("draft")
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
        return _record(q, out, time.perf_counter() - t0, None, mode)
    except Exception as exc:  # a failure of the graph itself: recorded, never fatal to the run
        return _record(q, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}", mode)
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
) -> dict[str, Any]:
    """Run (or resume) a benchmark; returns this session's summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = read_records(out, repair=True)
    if retry_errors and any(r.get("error") for r in existing):
        existing = [r for r in existing if not r.get("error")]
        tmp = out / (RECORDS + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in existing))
        os.replace(tmp, out / RECORDS)
    done = {r["id"] for r in existing}
    todo = _pending(queries, done, limit)

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
        from tqdm import tqdm

        bar = tqdm(total=(total - len(done)) if total else None, desc=f"bench {mode}", unit="q")
    t0 = time.perf_counter()
    written = 0
    with (out / RECORDS).open("a", encoding="utf-8") as fh, ThreadPoolExecutor(concurrency) as pool:
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
                record = fut.result()
                fh.write(json.dumps(record) + "\n")  # only this thread writes: no lock needed
                fh.flush()
                written += 1
                n_total += 1
                n_correct += record["correct"]
                routes[record.get("route") or "error"] += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        acc=f"{n_correct / n_total:.3f}",
                        **{_SHORT.get(k, k): v for k, v in routes.items()},
                    )
            fill()
    if bar is not None:
        bar.close()
    session.update(finished=time.time(), wall_s=time.perf_counter() - t0, written=written)
    run_path = out / "run.json"
    run = json.loads(run_path.read_text()) if run_path.exists() else {"sessions": []}
    run["sessions"].append(session)
    run_path.write_text(json.dumps(run, indent=2))
    return {
        "written": written,
        "total": n_total,
        "accuracy": n_correct / n_total if n_total else 0.0,
        "routes": dict(routes),
    }


def _pending(
    queries: Iterable[BenchQuery], done: set[str], limit: int | None
) -> Iterator[BenchQuery]:
    for i, q in enumerate(queries):
        if limit is not None and i >= limit:
            return
        if q.id not in done:
            yield q
