"""Benchmark loaders for the published layouts, reading lazily from a local path.

- **V\\* Bench** (``craigwu/vstar_bench``): ``direct_attributes/`` and ``relative_position/``
  folders of ``X.jpg`` + ``X.json`` (``question``, ``options``; the correct option is
  ``options[0]``). Options are shuffled with a fixed seed per query and the expected letter
  follows the shuffle (unshuffled, the answer would always be "A"). The synthetic suite uses
  the same layout with more folders.
- **HR-Bench** (``DreamMr/HR-Bench``): ``hr_bench_4k.tsv`` / ``hr_bench_8k.tsv`` (or
  ``.parquet``) with ``index, question, answer, category, A..D, cycle_category, image``
  (base64). Rows are streamed; a 4 GB TSV is never in memory.
- **POPE** (``lmms-lab/POPE``, config ``Full``): parquet files under
  ``Full/{adversarial,popular,random}`` with ``question_id, question, answer, image{bytes}``,
  read in record batches.

Images of TSV/parquet rows are handed over as bytes and kept in the image store (``blob://``) only while
their query is in flight: the runner releases each one when its record is written.

Get the data with your usual tools (``git lfs clone`` of the dataset repositories or
``huggingface-cli download --repo-type dataset ...``) on a machine with access, then point
``--data`` at the folder or file.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..prompts import option_letters

__all__ = [
    "BENCHMARKS",
    "BenchQuery",
    "count_benchmark",
    "load_benchmark",
    "load_hrbench",
    "load_pope",
    "load_vstar",
]


@dataclass
class BenchQuery:
    """One benchmark item. ``image`` is a path, or ``image_bytes`` returns encoded bytes."""

    id: str
    question: str
    expected: str  # the letter ("A".."D") or, for yes/no tasks, "yes"/"no"
    split: str
    options: list[str] | None = None
    image: str | None = None
    image_bytes: Callable[[], bytes] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return "choice" if self.options else "yesno"


def _shuffled(options: list[str], seed: int, qid: str) -> tuple[list[str], str]:
    """Options in a fixed pseudo-random order per query; returns (options, expected letter)."""
    digest = int(hashlib.sha1(f"{seed}:{qid}".encode()).hexdigest()[:8], 16)
    order = np.random.default_rng(digest).permutation(len(options))
    shuffled = [options[i] for i in order]
    return shuffled, option_letters(len(options))[int(np.where(order == 0)[0][0])]


def load_vstar(
    path: str | Path, *, seed: int = 0, splits: list[str] | None = None, shuffle: bool = True
) -> Iterator[BenchQuery]:
    """V* layout (also the synthetic suite): every sub-folder is a split.

    The correct option is always the first in the files. ``shuffle`` (the default) puts the
    options in a fixed pseudo-random order per query, so a model that always says "A" is at
    chance; ``shuffle=False`` keeps the files' order, as the published evaluation does (the
    answer is then always "A").
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"V* data folder not found: {root}")
    folders = sorted(
        p for p in root.iterdir() if p.is_dir() and (splits is None or p.name in splits)
    )
    if not folders:
        raise FileNotFoundError(f"no split folders (e.g. direct_attributes/) under {root}")
    for folder in folders:
        for meta_path in sorted(folder.glob("*.json")):
            meta = json.loads(meta_path.read_text())
            image = next(
                (
                    meta_path.with_suffix(ext)
                    for ext in (".jpg", ".jpeg", ".png")
                    if meta_path.with_suffix(ext).exists()
                ),
                None,
            )
            if image is None:
                raise FileNotFoundError(f"no image next to {meta_path}")
            qid = f"{folder.name}/{meta_path.stem}"
            options, letter = (
                _shuffled(list(meta["options"]), seed, qid)
                if shuffle
                else (list(meta["options"]), "A")
            )
            extra = {k: v for k, v in meta.items() if k not in ("question", "options")}
            extra["answer_text"] = meta["options"][0]
            yield BenchQuery(
                qid, meta["question"], letter, folder.name, options, image=str(image), meta=extra
            )


def _hr_row(row: dict[str, Any], split: str) -> BenchQuery:
    options = [str(row[k]) for k in "ABCD" if row.get(k) not in (None, "") and str(row[k]) != "nan"]
    data = row["image"]
    image_bytes = (
        (lambda d=data: base64.b64decode(d)) if isinstance(data, str) else (lambda d=data: bytes(d))
    )
    meta = {"category": row.get("category"), "cycle_category": row.get("cycle_category")}
    return BenchQuery(
        str(row["index"]),
        str(row["question"]),
        str(row["answer"]).strip().upper(),
        split,
        options,
        image_bytes=image_bytes,
        meta=meta,
    )


def load_hrbench(path: str | Path) -> Iterator[BenchQuery]:
    """HR-Bench TSV or parquet; the split is the file's stem (``hr_bench_4k``)."""
    path = Path(path)
    files = (
        sorted(path.glob("hr_bench_*.tsv")) + sorted(path.glob("hr_bench_*.parquet"))
        if path.is_dir()
        else [path]
    )
    if not files:
        raise FileNotFoundError(f"no hr_bench_*.tsv or .parquet under {path}")
    for f in files:
        if f.suffix == ".tsv":
            csv.field_size_limit(sys.maxsize)  # one cell holds a whole base64 8K image
            with f.open(newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh, delimiter="\t"):
                    yield _hr_row(row, f.stem)
        else:
            for row in _parquet_rows(f):
                yield _hr_row(row, f.stem)


def _parquet_rows(path: Path, batch_size: int = 16) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            "reading parquet needs pyarrow: pip install 'speceyes-graph[bench]'"
        ) from exc
    with pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(batch_size=batch_size):
            yield from batch.to_pylist()


def load_pope(path: str | Path, *, splits: list[str] | None = None) -> Iterator[BenchQuery]:
    """POPE ``Full`` parquet files; the split comes from the file or folder name."""
    root = Path(path)
    files = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"no parquet files under {root}")
    for f in files:
        split = next((s for s in ("adversarial", "popular", "random") if s in f.as_posix()), f.stem)
        if splits is not None and split not in splits:
            continue
        for row in _parquet_rows(f):
            image = row["image"]
            raw = image.get("bytes") if isinstance(image, dict) else image
            qid = f"{split}/{row.get('question_id', row.get('id'))}"
            yield BenchQuery(
                qid,
                str(row["question"]),
                str(row["answer"]).strip().lower(),
                split,
                None,
                image_bytes=partial(bytes, raw),
                meta={"category": row.get("category"), "image_source": row.get("image_source")},
            )


BENCHMARKS: dict[str, Callable[..., Iterator[BenchQuery]]] = {
    "vstar": load_vstar,
    "synthetic": load_vstar,
    "hrbench": load_hrbench,
    "pope": load_pope,
}


def load_benchmark(
    name: str, path: str | Path, *, shuffle_options: bool = True, **kwargs: Any
) -> Iterator[BenchQuery]:
    """A benchmark's queries, lazily; ``shuffle_options`` applies to V* and the synthetic suite
    (HR-Bench has its answer letters, POPE has no options)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; use one of {', '.join(BENCHMARKS)}")
    if name in ("vstar", "synthetic"):
        kwargs["shuffle"] = shuffle_options
    return BENCHMARKS[name](path, **kwargs)


def count_benchmark(name: str, path: str | Path) -> int | None:
    """How many queries a benchmark holds, without loading it (for progress and ETA):
    files for V*, row counts from parquet metadata, lines of a TSV (one row per line)."""
    root = Path(path)
    if name in ("vstar", "synthetic"):
        return sum(1 for p in root.glob("*/*.json")) if root.is_dir() else None
    files = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
    if name == "hrbench" and root.is_dir():
        files = sorted(root.glob("hr_bench_*.tsv")) + sorted(root.glob("hr_bench_*.parquet"))
    total = 0
    for f in files:
        if f.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                return None
            total += pq.ParquetFile(f).metadata.num_rows
        elif f.suffix == ".tsv":
            with f.open("rb") as fh:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b""))
            total += max(0, lines - 1)  # the header
    return total
