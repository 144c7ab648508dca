"""A public corpus of real-world image files through every path that reads images.

``scripts/setup-corpus.sh`` (part of the README's test command) unpacks Pillow's own test images
from its source distribution: about a thousand files in every format Pillow reads, truncated,
malformed and fuzzer-found ones among them, written by nobody here. ``tests/image_corpus.py``
sends each through the store's decode, a comparison with Pillow, the graph (by path and as a
``data:`` URL) and the zoom and OCR tools, in worker processes that a crash or a hang cannot
take down with it. The counts go to the CI log (see ``pytest_terminal_summary`` in
``conftest.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from image_corpus import PATHS, corpus_files, run_corpus, summary

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / ".corpus" / "last-report.txt"


@pytest.fixture(scope="module")
def corpus_results():
    folders = sorted((ROOT / ".corpus").glob("pillow-*/.complete"))
    assert folders, "no image corpus: run `bash scripts/setup-corpus.sh` (the README's test command does)"
    files = corpus_files(folders[-1].parent)
    t0 = time.time()
    results = run_corpus(files, workers=1, timeout=60)
    REPORT.write_text(summary(results, time.time() - t0))
    return results


def test_no_file_crashes_hangs_or_blows_up_memory(corpus_results):
    assert len(corpus_results) > 1000
    bad = {
        Path(r["file"]).name: {p: r[p] for p in PATHS if r.get(p) in ("crash", "hang", "memory")}
        for r in corpus_results
        if any(r.get(p) in ("crash", "hang", "memory") for p in PATHS)
    }
    assert not bad


def test_every_path_agrees_on_which_files_are_images(corpus_results):
    """A file the store decodes works everywhere; one it refuses is refused everywhere, with
    a recorded error that names it."""
    for r in corpus_results:
        outcomes = {r[p] for p in PATHS if p != "pillow"}
        assert outcomes in ({"ok"}, {"error"}), (r["file"], outcomes)
        if r["decode"] == "error":
            assert "image " in r["decode_error"] and r["decode_error"].strip(), r
    assert sum(r["decode"] == "ok" for r in corpus_results) > 800


def test_every_difference_from_pillow_has_a_reason(corpus_results):
    differs = [r for r in corpus_results if r["pillow"] == "differs"]
    unexplained = [r for r in differs if r["pillow_reason"].startswith(("unexplained", "shape"))]
    assert not unexplained, [(Path(r["file"]).name, r["pillow_reason"]) for r in unexplained]
    # the known reasons: wide samples by their declared depth, floats as 0.0-1.0, and files
    # Pillow cannot read that OpenCV does (speceyes_tools.formats: a TIFF variant)
    assert all(
        "samples" in r["pillow_reason"] or r["pillow_reason"].startswith("Pillow cannot read it")
        for r in differs
    )
