"""Result files of the published SpecEyes scripts, brought in as a run folder our tools read.

Files of one run (one per split) become ``records.jsonl`` and ``run.json`` as our runner
writes them, each line read by :func:`.official_lines.official_record`; lines that cannot be
records are reported, written to ``import-skipped.jsonl`` with the reason, and skipped: one bad
line never stops an import. The scripts time files, not queries: the folder's
``latency_summary.json`` gives each file's wall time, which becomes its session's, and
per-query latencies stay empty (so do modelled speedups).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..gate.separability import DEFAULT_ALPHA, DEFAULT_K
from .official_lines import (
    AGGREGATION_NAMES,
    BENCHMARK_NAMES,
    SPLITS,
    BadLine,
    OfficialRun,
    official_record,
    parse_result_name,
)
from .runner import RECORDS, _replace, run_settings

__all__ = ["ImportResult", "import_official"]


@dataclass
class ImportResult:
    """What an import wrote and what it set aside (line numbers are 1-based, per file)."""

    out: Path
    imported: Counter[str] = field(default_factory=Counter)  # per file
    skipped: list[dict[str, Any]] = field(default_factory=list)  # file, line, reason
    notes: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)


def _run_for(path: Path, overrides: Mapping[str, Any]) -> OfficialRun:
    found = parse_result_name(path)
    settings = {**found, **{k: v for k, v in overrides.items() if v is not None}}
    if settings.get("benchmark") not in SPLITS:
        raise ValueError(
            f"{path.name}: cannot tell the benchmark from the name; pass --benchmark vstar|hr|pope"
        )
    if not settings.get("split"):
        raise ValueError(f"{path.name}: cannot tell the split from the name; pass --split")
    mode = settings.get("mode") or "speceyes"
    if mode == "speceyes" and settings.get("tau") is None:
        raise ValueError(f"{path.name}: cannot tell the threshold from the name; pass --tau")
    return OfficialRun(
        benchmark=settings["benchmark"],
        split=settings["split"],
        mode=mode,
        aggregation=settings.get("aggregation") if mode == "speceyes" else None,
        tau=settings.get("tau") if mode == "speceyes" else None,
        k=int(settings.get("k") or DEFAULT_K),
        large_model=settings.get("large_model"),
        small_model=settings.get("small_model"),
        batch_size=settings.get("batch_size"),
        phase1_small=bool(settings.get("phase1_small")),
    )


def _wall_times(path: Path) -> float | None:
    """The scripts' ``latency_summary.json`` beside the file: wall seconds per file name."""
    summary = path.parent / "latency_summary.json"
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return None
    value = data.get(path.name) if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _options_lookup(benchmark: str, data: Path) -> dict[tuple[str, str], list[str]]:
    """(split, key) -> options, from the dataset in its published layout (V*: by image file
    name, unshuffled as the scripts read it; HR-Bench: by row number, as the scripts count)."""
    from .datasets import load_hrbench, load_vstar

    lookup: dict[tuple[str, str], list[str]] = {}
    if benchmark == "vstar":
        for q in load_vstar(data, shuffle=False):
            lookup[(q.split, Path(q.image or "").name)] = list(q.options or [])
    elif benchmark == "hr":
        rows: Counter[str] = Counter()
        for q in load_hrbench(data):
            lookup[(q.split, str(rows[q.split]))] = list(q.options or [])
            rows[q.split] += 1
    return lookup


def import_official(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    benchmark: str | None = None,
    split: str | None = None,
    mode: str | None = None,
    aggregation: str | None = None,
    tau: float | None = None,
    data: str | Path | None = None,
) -> ImportResult:
    """Turn result files of one run (one file per split) into the run folder ``out_dir``.

    The folder is written whole (``records.jsonl``, ``run.json``; lines set aside go to
    ``import-skipped.jsonl``), so importing the same files again gives the same folder. A
    folder holding a run of our own is never overwritten."""
    out = Path(out_dir)
    if mode not in (None, "speceyes", "agent"):
        raise ValueError(f"mode must be speceyes or agent, got {mode!r}")
    if aggregation is not None and aggregation not in AGGREGATION_NAMES:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATION_NAMES)}")
    runs = [(Path(p), _run_for(Path(p), {
        "benchmark": benchmark, "split": split, "mode": mode, "aggregation": aggregation, "tau": tau,
    })) for p in paths]  # fmt: skip
    kinds = {(r.benchmark, r.mode, r.aggregation, r.tau) for _, r in runs}
    if len(kinds) > 1:
        raise ValueError(
            "these files are not one run (benchmark, mode, aggregation, threshold differ: "
            f"{sorted(map(str, kinds))}); import each run into its own folder"
        )
    if (out / RECORDS).exists():
        settings = run_settings(out)
        if settings.get("source") != "official":
            raise ValueError(f"{out} holds a run that was not imported; choose another --out")
    lookups: dict[str, dict[tuple[str, str], list[str]]] = {}
    result = ImportResult(out)
    records: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    sessions = []
    for path, run in runs:
        if data is not None and run.benchmark not in lookups:
            lookups[run.benchmark] = _options_lookup(run.benchmark, Path(data))
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    try:
                        line = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        raise BadLine(f"not JSON ({exc.__class__.__name__})") from None
                    record = official_record(line, run, options_lookup=lookups.get(run.benchmark))
                    if record["id"] in seen:
                        raise BadLine(f"{record['id']} again (first in {seen[record['id']]})")
                except BadLine as exc:
                    result.skipped.append({"file": str(path), "line": number, "reason": str(exc)})
                    continue
                seen[record["id"]] = f"{path.name}:{number}"
                note = record["meta"].get("options_note")
                if note:
                    result.notes[note] += 1
                if record["draft"] is not None and record["draft_correct"] is None:
                    result.notes["draft text not kept: its correctness is unknown"] += 1
                result.imported[str(path)] += 1
                result.routes[record["route"]] += 1
                records.append(record)
        sessions.append(
            {
                "settings": _settings(run, runs, data),
                "mode": run.mode,
                "source_file": str(path),
                "written": result.imported[str(path)],
                **({"wall_s": wall} if (wall := _wall_times(path)) is not None else {}),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    _replace(out / RECORDS, b"".join(json.dumps(r).encode() + b"\n" for r in records))
    _replace(out / "run.json", json.dumps({"sessions": sessions}, indent=2).encode())
    skipped = out / "import-skipped.jsonl"
    if result.skipped:
        _replace(skipped, b"".join(json.dumps(s).encode() + b"\n" for s in result.skipped))
    elif skipped.exists():
        skipped.unlink()
    return result


def _settings(
    run: OfficialRun, runs: Sequence[tuple[Path, OfficialRun]], data: Any
) -> dict[str, Any]:
    """``run.json`` settings as our runner writes them, plus where the run came from."""
    return {
        "benchmark": BENCHMARK_NAMES[run.benchmark],
        "mode": run.mode,
        "threshold": run.tau,
        "aggregation": AGGREGATION_NAMES.get(run.aggregation or "", None),
        "alpha": DEFAULT_ALPHA if run.mode == "speceyes" else None,
        "k": run.k if run.mode == "speceyes" else None,
        "schedule": "official",
        "source": "official",
        "variant": _variant(run.large_model),
        "models": {"large": run.large_model, "small": run.small_model},
        "batch_size": run.batch_size,
        "phase1_small_judge": run.phase1_small,
        "files": [str(p) for p, _ in runs],
        "data": str(data) if data is not None else None,
    }


def _variant(large: str | None) -> str | None:
    name = (large or "").lower()
    return "thyme" if "thyme" in name else "deepeyes" if "deepeyes" in name else None
