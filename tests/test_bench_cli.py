"""`speceyes bench` as a user meets it: checked arguments, the demo spec, fast failure for
unknown hub ids offline, a clean Ctrl-C, one writer per run folder, files that survive crashes."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import not_our_progress
from speceyes_graph.benchmarks import generate_suite
from speceyes_graph.benchmarks.datasets import count_benchmark, load_benchmark
from speceyes_graph.benchmarks.runner import RECORDS, read_records, scan_records


def bench(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "speceyes_graph.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    folder = tmp_path_factory.mktemp("suite")
    generate_suite(folder, 12, seed=3, max_side=900)
    return folder


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "small"], "--mode small needs --small"),
        (["--mode", "speceyes", "--small", "demo"], "--mode speceyes needs --large"),
        (
            ["--mode", "agent", "--large", "demo", "--threshold", "1.5"],
            "--threshold must be in [0, 1]",
        ),
        (
            ["--mode", "small", "--small", "openai:localhost:8000"],
            "write openai:BASE_URL#MODEL_NAME",
        ),
        (["--mode", "small", "--small", "/no/such/ckpt/"], "neither a folder, a hub id"),
        (["--small", "tiny:/nowhere", "--large", "tiny:/nowhere"], "not a tiny checkpoint"),
        (["--mode", "small", "--small", "demo", "--max-batch-tokens", "0"], "a positive number"),
        (
            ["--small", "demo", "--large", "ChenShawn/DeepEyes-7B"],
            "demo for both models or for neither",
        ),
        (["--small", "demo", "--large", "demo", "--max-risk", "2"], "--max-risk must be in (0, 1)"),
        (["--mode", "agent", "--large", "demo", "--max-risk", "0.02"], "needs --mode speceyes"),
    ],
)
def test_arguments_are_checked_up_front(suite, tmp_path, args, message, capsys):
    from speceyes_graph.cli import main

    # in process (the command's own checks, before any model loads; the subprocess tests
    # below start the command as users do)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--benchmark", "synthetic", "--data", str(suite),
              "--out", str(tmp_path / "o"), *args])  # fmt: skip
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2 and message in stderr, stderr
    assert "Traceback" not in stderr and not (tmp_path / "o").exists()


def test_an_unknown_hub_id_fails_fast_offline(suite, tmp_path):
    t0 = time.perf_counter()
    r = bench(
        "--benchmark", "synthetic", "--data", str(suite), "--out", str(tmp_path / "o"),
        "--mode", "small", "--small", "nobody/no-such-model-xyz",
        env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert r.returncode == 2 and "not in the local cache" in r.stderr
    assert time.perf_counter() - t0 < 30  # seconds, not minutes of retries


def test_the_demo_spec_runs_with_its_prompts(suite, tmp_path):
    out = tmp_path / "demo-run"
    r = bench(
        "--benchmark", "synthetic", "--data", str(suite), "--out", str(out),
        "--small", "demo", "--large", "demo", "--limit", "4",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not_our_progress(r.stderr) == []  # no library warnings or load reports
    records = read_records(out)
    assert len(records) == 4 and not any(r["error"] for r in records)
    run = json.loads((out / "run.json").read_text())
    assert run["sessions"][0]["settings"]["small"] == "demo"
    assert run["sessions"][0]["settings"]["max_batch_tokens"] == "auto"
    assert (
        "large: " in r.stdout and "generate call" in r.stdout and "mean batch" in r.stdout
    )  # how it batched
    # the demo agent speaks its own short prompt, not the 290-token DeepEyes declaration
    agentic = [r for r in records if r["agent_steps"]]
    assert all(len(r["agent_steps"]) <= 4 for r in agentic)


def test_bench_gates_online(suite, tmp_path):
    """--max-risk: each draft records the tau it met and whether it was shadowed, the command
    prints what the gate did, and the report draws its path."""
    out = tmp_path / "online"
    r = bench(
        "--benchmark", "synthetic", "--data", str(suite), "--out", str(out), "--small", "demo",
        "--large", "demo", "--limit", "6", "--max-risk", "0.05", "--shadow-rate", "1",
        "--gate-warmup", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    drafts = [rec["draft"] for rec in read_records(out) if rec["draft"]]
    assert drafts and all("tau" in d and "shadowed" in d for d in drafts)
    assert "online gate: tau 0.98 -> " in r.stdout
    from speceyes_graph.benchmarks.report import build_report

    path = build_report(out)["online_gate"]
    assert path["gated"] == len(drafts) and path["max_risk"] == 0.05


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(tiny_models, tmp_path):
    # 36 queries, two in flight: the tiny model answers a pair in a fraction of a second, so
    # with the 12 of the shared suite the run could end between the poll that saw two
    # records and the signal (it did, once, on a loaded machine)
    suite = tmp_path / "suite"
    generate_suite(suite, 36, seed=5, max_side=600)
    out = tmp_path / "interrupted"
    args = [
        "--benchmark", "synthetic", "--data", str(suite), "--out", str(out), "--mode", "agent",
        "--large", f"tiny:{tiny_models['large'].parent}", "--batch-size", "1",
        "--max-new-tokens", "48", "--max-agent-steps", "3",
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "speceyes_graph.cli", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a pytest-xdist worker ignores SIGINT, and a child inherits that: Python then never
        # installs its Ctrl-C handler, and the run finished instead of stopping (exit 0)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 240
    while time.time() < deadline and len(scan_records(out).records) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    seen = len(scan_records(out).records)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (seen, err[-1500:])  # diagnostics if it ran to the end
    assert proc.returncode == 130 and "rerun the same command to resume" in err
    assert "Traceback" not in err
    kept = len(read_records(out))
    assert 2 <= kept < 36  # it stopped: the queries still running were not waited for
    run = json.loads((out / "run.json").read_text())
    assert run["sessions"][-1]["interrupted"] is True
    r = bench(*args)
    assert r.returncode == 0, r.stderr
    ids = [json.loads(line)["id"] for line in (out / RECORDS).read_text().splitlines()]
    assert len(ids) == 36 and len(set(ids)) == 36  # every query once


def test_one_writer_per_run_folder(suite, tmp_path):
    out = tmp_path / "locked"
    out.mkdir()
    with (out / ".lock").open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another bench holds the folder
        r = bench(
            "--benchmark", "synthetic", "--data", str(suite), "--out", str(out),
            "--small", "demo", "--large", "demo", "--limit", "1",
        )  # fmt: skip
    assert r.returncode == 2 and "another process is writing to" in r.stderr
    assert not (out / RECORDS).exists()


def test_corrupt_lines_are_set_aside_not_the_records_after_them(tmp_path):
    good = [{"id": f"q{i}", "correct": True, "route": "speculative"} for i in range(30)]
    lines = [json.dumps(r) for r in good]
    lines.insert(4, "{not json")
    lines.insert(10, json.dumps(good[2]))  # a repeated id (two writers once)
    lines.insert(12, '"just a string"')
    (tmp_path / RECORDS).write_text("\n".join(lines) + '\n{"id": "q99", "correct"')  # torn tail
    scan = scan_records(tmp_path)
    assert [r["id"] for r in scan.records] == [r["id"] for r in good]
    assert scan.corrupt == [5, 13] and scan.duplicates == [11] and scan.torn_tail
    assert len(read_records(tmp_path, repair=True)) == 30
    assert len((tmp_path / RECORDS).read_text().splitlines()) == 30  # repaired in place
    assert len((tmp_path / "records.corrupt.jsonl").read_text().splitlines()) == 3


def test_a_torn_run_json_does_not_stop_the_next_run(suite, tmp_path):
    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.benchmarks import run_benchmark
    from speceyes_graph.models import ScriptedChatModel

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"sessions": [{"started": 1')  # a crash mid-write
    g = create_speceyes_graph(
        agent=ScriptedChatModel(respond=lambda m: "<answer>A</answer>"), mode="agent"
    ).compile()
    summary = run_benchmark(
        g, load_benchmark("synthetic", suite), out, mode="agent", progress=False, limit=3
    )
    assert summary["written"] == 3
    assert len(json.loads((out / "run.json").read_text())["sessions"]) == 1
    assert (out / "run.json.corrupt").exists()


def test_counts_for_progress_and_eta(suite, tmp_path):
    assert (
        count_benchmark("synthetic", suite) == 12 == len(list(load_benchmark("synthetic", suite)))
    )
    tsv = tmp_path / "hr_bench_4k.tsv"
    tsv.write_text("index\tquestion\tanswer\n" + "".join(f"{i}\tq\tA\n" for i in range(7)))
    assert count_benchmark("hrbench", tmp_path) == 7
