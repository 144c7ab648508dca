"""Several graph workers (OS processes) sharing one Postgres for checkpoints and blobs.

The harness plays the platform's run queue (``tests/graph_worker.py``): each thread's runs
run in order, each on whichever worker is free, so a chat thread's follow-up usually lands
on another worker than the run that pasted its image. Afterwards every run has exactly one
result, every thread holds exactly its own turns (a run done twice would add turns), and
every answer is the one its own question gets. A worker killed with SIGKILL mid-run leaves
its run to another worker, which resumes it from the thread's checkpoint.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

WORKER = Path(__file__).with_name("graph_worker.py")
ROOT = WORKER.parents[1]


def start_workers(dsn: str, names: list[str], log_dir: Path) -> dict[str, subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LANGSMITH_TRACING": "false"}
    return {
        name: subprocess.Popen(
            [sys.executable, str(WORKER), dsn, name],
            env=env,
            stdout=open(log_dir / f"{name}.log", "w"),
            stderr=subprocess.STDOUT,
        )
        for name in names
    }


def queue(dsn: str, runs: list[tuple]) -> None:
    import psycopg
    from graph_worker import QUEUE
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(dsn) as saver:  # the schema, once, as a deploy does
        saver.setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(QUEUE)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO harness_runs (id, thread_id, seq, question, image)"
                " VALUES (%s, %s, %s, %s, %s)",
                runs,
            )


def rows(dsn: str) -> list[dict]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM harness_runs ORDER BY id").fetchall()


def wait_for(procs, log_dir, timeout_s):
    deadline = time.time() + timeout_s
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(
                f"worker {name} did not finish:\n{(log_dir / f'{name}.log').read_text()[-3000:]}"
            )
        if proc.returncode not in (0, -signal.SIGKILL):
            pytest.fail(f"worker {name} failed:\n{(log_dir / f'{name}.log').read_text()[-3000:]}")


def image_url(path: str) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def check(dsn, runs):
    """Every run done once, on its own thread, with its own answer; threads hold their turns."""
    import psycopg

    done = rows(dsn)
    assert [r["id"] for r in done] == [r[0] for r in runs]  # none lost
    assert all(r["status"] == "done" for r in done), [r for r in done if r["status"] != "done"]
    for r in done:
        result = r["result"]
        expected = ("speculative", "A") if "big" in r["question"] else ("judged-agentic", "B")
        assert result["error"] is None, result
        assert (result["route"], result["answer"]) == expected, (r["question"], result)
        assert result["last_question"] == r["question"]  # its own question: not misrouted
        assert result["messages"] == 2 * (r["seq"] + 1)  # its thread's turns, none doubled
    with psycopg.connect(dsn) as conn:  # and the checkpoints agree
        threads = conn.execute("SELECT count(DISTINCT thread_id) FROM checkpoints").fetchone()[0]
    assert threads == len({r[1] for r in runs})
    return done


def test_a_thousand_runs_over_four_workers(postgres_dsn, tmp_path, scene):
    image = image_url(scene)
    runs, n_threads, per_thread = [], 250, 4
    for seq in range(per_thread):  # queued turn by turn, as users come back to their chats
        for t in range(n_threads):
            kind = "big" if (t + seq) % 3 else "tiny"
            question = f"{kind}? thread {t} turn {seq}"
            runs.append((len(runs), f"thread-{t}", seq, question, image if seq == 0 else None))
    queue(postgres_dsn, runs)
    names = [f"w{i}" for i in range(4)]
    procs = start_workers(postgres_dsn, names, tmp_path)
    wait_for(procs, tmp_path, timeout_s=900)
    done = check(postgres_dsn, runs)
    by_worker = {n: sum(r["finished_by"] == n for r in done) for n in names}
    assert all(by_worker.values()), by_worker  # every worker took part
    # follow-ups found their thread's image and history on other workers
    workers_of: dict[str, set] = {}
    for r in done:
        workers_of.setdefault(r["thread_id"], set()).add(r["finished_by"])
    moved = sum(len(w) > 1 for w in workers_of.values())
    assert moved > n_threads // 2
    assert not any(r["resumed"] for r in done) and all(r["attempts"] == 1 for r in done)


def test_a_worker_killed_mid_run_is_resumed_by_another(postgres_dsn, tmp_path, scene):
    import psycopg

    image = image_url(scene)
    runs = []
    for t in range(6):
        runs.append((len(runs), f"thread-{t}", 0, f"slow tiny? thread {t}", image))
        runs.append((len(runs), f"thread-{t}", 1, f"big? thread {t} again", None))
    queue(postgres_dsn, runs)
    procs = start_workers(postgres_dsn, ["w0", "w1", "w2", "w3"], tmp_path)
    victim, victim_run = None, None
    deadline = time.time() + 120
    while victim is None and time.time() < deadline:  # a worker inside a slow agent turn
        for r in rows(postgres_dsn):
            if r["status"] == "running" and r["question"].startswith("slow"):
                with psycopg.connect(postgres_dsn) as conn:
                    checkpointed = conn.execute(
                        "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND"
                        " metadata->>'harness_run' = %s",
                        (r["thread_id"], str(r["id"])),
                    ).fetchone()[0]
                if checkpointed:  # past the judge and the gate: the agent turn is running
                    victim, victim_run = r["worker"], r
                    break
        time.sleep(0.05)
    assert victim is not None, "no worker was caught mid-run"
    procs[victim].send_signal(signal.SIGKILL)
    procs[victim].wait()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # the platform's lease expires
        conn.execute(
            "UPDATE harness_runs SET status = 'pending' WHERE status = 'running' AND worker = %s",
            (victim,),
        )
    wait_for({n: p for n, p in procs.items() if n != victim}, tmp_path, timeout_s=300)
    done = check(postgres_dsn, runs)
    retried = next(r for r in done if r["id"] == victim_run["id"])
    assert retried["attempts"] == 2 and retried["resumed"] and retried["finished_by"] != victim
    assert sum(r["resumed"] for r in done) == 1
    with psycopg.connect(postgres_dsn) as conn:  # the killed run's input was submitted once
        inputs = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND metadata->>'source' = 'input'",
            (victim_run["thread_id"],),
        ).fetchone()[0]
    assert inputs == 2  # its two runs, each submitted once
    json.dumps(done, default=str)  # the records are plain data
