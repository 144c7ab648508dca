"""The shipped demo checkpoints: they load like real ones, behave as recorded, and the demo runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import not_our_progress
from speceyes_graph.benchmarks.runner import read_records
from speceyes_graph.demo import demo_checkpoints, demo_models, fixed_routes

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "demo_golden.json"


@pytest.fixture(scope="module")
def models():
    # unbatched (max_batch_size=1), so batch composition cannot flip a near-tie in greedy decoding
    return demo_models(batch_size=1)


def test_checkpoints_load_through_the_ordinary_path(models):
    assert type(models["small"].hf_model).__name__ == "Qwen3VLForConditionalGeneration"
    assert type(models["large"].hf_model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    for kind, path in demo_checkpoints().items():
        size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
        assert size < 15, f"{kind} checkpoint is {size:.1f} MB"
    assert models["large"].resize_spec.max_pixels == 112 * 112


def test_fixed_queries_give_the_recorded_routes_and_answers(models, tmp_path):
    """Guards against a silently broken checkpoint: regenerate the golden file when retraining
    (python3 scripts/make_demo_golden.py)."""
    golden = json.loads(GOLDEN.read_text())
    assert fixed_routes(models, tmp_path, golden["n"], golden["seed"]) == golden["results"]
    assert {r["route"] for r in golden["results"]} >= {"speculative", "judged-agentic"}


def test_demo_command_end_to_end(tmp_path):
    out = tmp_path / "d"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "speceyes_graph",
            "demo",
            "--n",
            "12",
            "-o",
            str(out),
            "--specreason",
            "--online",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 12 and summary["errors"] == 0 and summary["n_needs_zoom"] == 4
    readme = (out / "README.md").read_text()
    # every figure is printed with its definition, once, with the same value in every file
    for name in ("beta", "alpha", "tau", "separability", "speedup_wall", "ideal_speedup", "auroc"):
        assert sum(line.startswith(name + " ") for line in r.stdout.splitlines()) == 1, name
        assert f"- **{name}**:" in readme
    report = json.loads((out / "run-speceyes" / "report.json").read_text())["summary"]
    wall = next(line for line in r.stdout.splitlines() if line.startswith("speedup_wall "))
    assert f"{report['speedup_wall']:.2f}x" in wall and f"{summary['speedup_wall']:.2f}x" in wall
    assert "(measured/ideal = " in r.stdout and "= separability 6.49" in r.stdout
    for mode in ("agent only", "SpecEyes", "small model only", "SpecReason"):
        assert mode in r.stdout
    assert set(summary["rows"]) == {"agent", "speceyes", "online", "small", "specreason"}
    # the online gate: its row, its line, its path in its report, against agent only
    online = summary["online"]
    assert "SpecEyes online" in r.stdout and "online gate: target risk 0.05" in r.stdout
    drafted = sum(r["route"] != "judged-agentic" for r in read_records(out / "run-online"))
    assert online["gated"] == drafted and online["against"] == "agent"
    assert online["shadow_runs"]["started"] == online["shadowed"]
    share = online["speedup_wall"] / summary["speedup_wall"]
    assert online["share_of_static_speedup"] == pytest.approx(share)
    assert f"({share:.2f} of the published tau's wall-time speedup)" in r.stdout
    assert online["shadow_tail_s"] >= 0 and "after the run's last answer" in r.stdout
    assert (out / "run-online" / "online_gate.png").exists()
    assert summary["specreason"]["steps"] >= 12
    methods = (out / "run-speceyes" / "report.md").read_text().split("## Methods compared")[1]
    assert "| SpecReason |" in methods and "| small model only" in methods
    assert "writing scenes" in r.stderr and "agent only" in r.stderr  # progress bars
    assert not_our_progress(r.stderr) == []  # and nothing else: no library warnings or reports
    gate_md = (out / "gate" / "report.md").read_text()
    assert gate_md.startswith("# The gate") and "run-small" not in gate_md.splitlines()[0]
    for name in (
        "workflow.png",
        "run-speceyes/report.md",
        "run-agent/records.jsonl",
        "gate/separability_hist.png",
        "gate/separability_vs_softmax_roc.png",
        "run-speceyes/accuracy_vs_speedup.png",
    ):
        assert (out / name).exists(), name
    assert summary["examples"], "no annotated example"
    for ex in summary["examples"]:
        assert (out / ex["file"]).exists() and ex["file"] in readme
    from PIL import Image

    width, height = Image.open(out / "workflow.png").size
    assert width >= 800 and height >= 800


def run_demo_command(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "speceyes_graph", "demo", "--no-progress", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.vllm
def test_demo_on_running_vllm_servers(vllm_servers, tmp_path):
    """--engine vllm with --small-url/--large-url: the same three configurations over the
    servers, and the table and README say which engine ran."""
    out = tmp_path / "d"
    urls = [vllm_servers["small"].url, vllm_servers["large"].url + "#large"]
    r = run_demo_command("--n", "12", "-o", str(out), "--engine", "vllm",
                         "--small-url", urls[0], "--large-url", urls[1])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors"] == 0 and set(summary["rows"]) == {"agent", "speceyes", "small"}
    engine = summary["engine"]
    assert engine["name"] == "vllm" and engine["description"].startswith("vLLM 0.32.0")
    assert urls[0] in engine["description"] and engine["setup_s"] is None
    assert f"engine: {engine['description']}" in r.stdout
    assert engine["description"] in (out / "README.md").read_text()
    assert summary["rows"]["agent"]["accuracy"] >= 0.9  # the checkpoints, answering as trained


@pytest.mark.vllm
def test_demo_starts_and_stops_its_own_vllm_servers(tmp_path):
    import re
    import socket

    out = tmp_path / "d"
    r = run_demo_command("--n", "6", "-o", str(out), "--engine", "vllm")
    assert r.returncode == 0, r.stderr[-3000:]
    engine = json.loads((out / "summary.json").read_text())["engine"]
    assert "started by the demo in" in engine["description"] and engine["setup_s"] > 0
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)/v1", engine["description"])]
    assert len(ports) == 2
    for port in ports:  # both servers are gone
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_demo_engine_arguments_are_checked():
    r = run_demo_command("--small-url", "http://127.0.0.1:1/v1", timeout=60)
    assert r.returncode != 0 and "--small-url and --large-url" in r.stderr
    r = run_demo_command("--engine", "vllm", "--small-url", "http://127.0.0.1:1/v1", timeout=60)
    assert r.returncode != 0 and "give both --small-url and --large-url" in r.stderr
