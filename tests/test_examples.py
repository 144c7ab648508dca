"""Every example runs as a user would run it, and prints what it should."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name, *args, cwd=None):
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd or ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_quickstart_on_the_demo_models():
    lines = [line.split() for line in run_example("quickstart.py").splitlines()]
    assert [row[0] for row in lines] == ["q000", "q001", "q002"]
    fields = [dict(item.split("=", 1) for item in row[2:]) for row in lines]
    for f in fields:
        assert f["route"] in ("speculative", "judged-agentic", "rejected-agentic")
        if f["route"] == "speculative":  # an accepted draft scored above tau and answered
            assert float(f["draft_score"]) > 0.98 and f["answer"] == f["expected"]
        else:  # the agent zoomed on the named region and read the colour there
            assert f["answer"] == f["expected"]
    assert {row[1] for row in lines} == {"needs-zoom", "no-zoom"}


def test_router_agent():
    lines = run_example("router_agent.py").splitlines()
    assert "route=text-model" in lines[0] and "Paris" in lines[0]
    assert "route=speculative" in lines[1] and "route=judged-agentic" in lines[2]
    assert all("messages=2" in line for line in lines)  # the parent's history is not duplicated


def test_toolset_from_toml():
    out = run_example("toolset_from_toml.py")
    assert "toolset my-vision -> ['zoom', 'ocr', 'my_tools:brightness']" in out
    assert "step 1: brightness box=None" in out
    assert (
        "step 2: zoom box=[2880, 2008, 2996, 2106]" in out
    )  # 0-1000 coordinates mapped to 4K pixels
    assert "route judged-agentic answer A" in out


def test_batch_folder_writes_a_csv(tmp_path):
    out = run_example("batch_folder.py", "--csv", str(tmp_path / "r.csv"), cwd=tmp_path)
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 16 and {"file", "route", "answer", "draft_score", "error"} <= set(rows[0])
    assert all(
        r["route"] in ("speculative", "judged-agentic", "rejected-agentic") and not r["error"]
        for r in rows
    )
    assert "16 images" in out and "generate calls" in out
    calls = int(out.split("large ")[1].split()[0])
    assert calls < 16 * 2  # batched across images: fewer generate calls than model turns


def test_streaming_shows_routes_as_they_happen():
    out = run_example("streaming.py")
    blocks = out.split("== ")[1:]
    assert (
        "judge: 'yes' -> agent loop" in blocks[0]
        and "agent step 1: calls image_zoom_in_tool" in blocks[0]
    )
    assert "gate: route rejected-agentic" in blocks[1] and "agent step 2: answers 'A'" in blocks[1]
    assert blocks[1].index("draft:") < blocks[1].index("gate:") < blocks[1].index("agent step 1")


def test_notebook_executes_headless():
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / "speceyes_walkthrough.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    images = sum(
        "image/png" in o.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    assert "route=speculative" in text and "route=rejected-agentic" in text and "AUROC" in text
    assert images >= 3  # workflow, routes, histogram + curve


def test_middleware_in_front_of_create_agent():
    """SpecEyesMiddleware in a LangChain agent: the turns it answers are the small model's
    confident drafts (right, here), the rest went to the agent."""
    lines = run_example("middleware.py").splitlines()
    rows = [dict(item.split("=", 1) for item in line.split()[2:6]) for line in lines[:12]]
    assert [line.split()[0] for line in lines[:12]] == [f"q{i:03d}" for i in range(12)]
    routes = [r["route"] for r in rows]
    assert set(routes) >= {"speculative", "judged-agentic"}
    for row, line in zip(rows, lines, strict=False):
        if row["route"] == "speculative":
            assert float(row["score"]) > 0.98 and f"reply='{row['expected']}'" in line
    assert lines[12] == f"SpecEyes answered {routes.count('speculative')} of 12 turns without the agent's loop"
    assert lines[13].startswith("agent alone ")
