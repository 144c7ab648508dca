"""Several Aegra instances over one PostgreSQL and one Redis, as users deploy them.

Aegra (``aegra-api``, ``scripts/setup-aegra.sh``: its own Python 3.12 environment) is the
open LangGraph server that runs on several hosts: runs go through a Redis job queue to the
instances' worker loops, each instance heartbeats the leases of the runs it holds, and a
reaper re-queues the runs of an instance whose leases lapse. Each instance here is its own
process group on a loopback port, serving the package's graphs on the shipped demo
checkpoints through one module (``graphs.py`` below: the models are built once per process,
however many graph ids name them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from speceyes_graph.models.servers import free_port  # never hands a port out twice

ROOT = Path(__file__).resolve().parent.parent
AEGRA = ROOT / ".venv-aegra" / "bin" / "aegra"

SERVE = ROOT / "speceyes_graph" / "serve.py"
LANGGRAPH_TABLES = """
import sys
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.store.postgres import PostgresStore
with PostgresSaver.from_conn_string(sys.argv[1]) as saver:
    saver.setup()
with PostgresStore.from_conn_string(sys.argv[1]) as store:
    store.setup()
"""
GATES = ROOT / "tests" / "served" / "gates.py"  # online gates for issues 66 and 75's tests
ROUTES = ROOT / "speceyes_graph" / "deploy" / "routes.py"  # the chat's image route
AUTH = ROOT / "speceyes_graph" / "deploy" / "auth.py"  # the shipped rules (serve-config's)
CONFIG = json.dumps(
    {
        "graphs": {
            "speceyes": f"{SERVE}:graph",
            "speceyes_chat": f"{SERVE}:chat_graph",
            "speceyes_online": f"{SERVE}:online_graph",
            "guarded": f"{GATES}:guarded",
            "failing_shadows": f"{GATES}:failing_shadows",
            "fair_share": f"{GATES}:fair_share",
        },
        "http": {"app": f"{ROUTES}:app"},
        # no identities: every caller is "anonymous" (tests/operator_attacks.py)
        "auth": {"path": f"{AUTH}:auth"},
    }
)
# the online gate of the graph "speceyes_online" (tests/test_aegra.py): it moves after a few
# queries, and shadows half the accepted drafts; its key is new each session
ONLINE_GATE = {
    "SPECEYES_GATE_KEY": os.urandom(24).hex(),  # signs the gate's entries (every instance)
    "SPECEYES_GATE_WARMUP": "10",
    "SPECEYES_GATE_WINDOW": "500",
    "SPECEYES_SHADOW_RATE": "0.5",
    # every run of the test counts (48 at once from one open-server minute: past the default
    # share of 25); the share is tested with fair_share (tests/operator_attacks.py)
    "SPECEYES_GATE_MAX_SHARE": "none",
}


class AegraCluster:
    """``AegraCluster(folder, dsn).start(2)``: Redis, the schema, and N instances."""

    def __init__(self, folder: Path, dsn: str, jobs_per_instance: int = 8):
        self.folder, self.dsn = Path(folder), dsn
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "aegra.json").write_text(CONFIG)
        self.redis_port = free_port()
        self.env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "REDIS_BROKER_ENABLED": "true",
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "AUTH_TYPE": "noop",
            "LOG_LEVEL": "WARNING",
            "RUN_MIGRATIONS_ON_STARTUP": "false",
            # concurrency per instance is WORKER_COUNT x N_JOBS_PER_WORKER
            "WORKER_COUNT": "1",
            "N_JOBS_PER_WORKER": str(jobs_per_instance),
            # a dead instance's runs are re-queued once its leases lapse: seconds, not minutes
            "HEARTBEAT_INTERVAL_SECONDS": "2",
            "LEASE_DURATION_SECONDS": "6",
            "REAPER_INTERVAL_SECONDS": "5",
            # a run created on an instance that died before queueing it (120 s by default)
            "STUCK_PENDING_THRESHOLD_SECONDS": "30",
            # pasted images, shared by the instances: a chat's follow-up that another
            # instance runs finds the thread's image there
            "SPECEYES_BLOB_URL": dsn,
            "OMP_NUM_THREADS": "1",
            **ONLINE_GATE,
        }
        self.redis: subprocess.Popen | None = None
        self.instances: list[tuple[int, subprocess.Popen]] = []
        self.instance_pids: list[set[int]] = []  # as started: a killed one's too

    def start(self, n: int, timeout: float = 600) -> AegraCluster:
        """Start everything; if any part fails, stop what was started and raise."""
        try:
            return self._start(n, timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, n: int, timeout: float) -> AegraCluster:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        done = subprocess.run(
            [str(AEGRA), "db", "upgrade"], env=self.env, cwd=self.folder,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"aegra db upgrade failed:\n{done.stderr[-3000:]}")
        # Each instance's start-up also runs LangGraph's own checkpoint and store migrations;
        # two instances starting together race on Postgres' catalogue (UniqueViolation on
        # "checkpoint_writes", seen in CI), so run them once first: the instances then find
        # them applied.
        done = subprocess.run(
            [str(AEGRA.parent / "python"), "-c", LANGGRAPH_TABLES, self.dsn],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"LangGraph table setup failed:\n{done.stderr[-3000:]}")
        # Each instance also creates the graphs' default assistants as it starts, and two
        # starting together on a fresh database race on that too (UniqueViolation on
        # "assistant_pkey", seen in CI): the first comes up alone, then the rest together.
        deadline = time.time() + timeout
        self._launch()
        self._wait_healthy(deadline)
        for _ in range(n - 1):
            self._launch()
        self._wait_healthy(deadline)
        self.instance_pids = [self.pids(i) for i in range(n)]
        return self

    def add(self, timeout: float = 600) -> int:
        """Start one more instance (beside those running); returns its index."""
        self._launch()
        self._wait_healthy(time.time() + timeout, only=len(self.instances) - 1)
        self.instance_pids.append(self.pids(len(self.instances) - 1))
        return len(self.instances) - 1

    def alive(self) -> list[int]:
        return [i for i, (_, proc) in enumerate(self.instances) if proc.poll() is None]

    def _launch(self) -> None:
        port = free_port()
        log = open(self.folder / f"aegra-{port}.log", "w")
        proc = subprocess.Popen(
            [str(AEGRA), "serve", "--host", "127.0.0.1", "--port", str(port),
             "-c", str(self.folder / "aegra.json")],
            env=self.env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes all of it
        )  # fmt: skip
        self.instances.append((port, proc))

    def _wait_healthy(self, deadline: float, only: int | None = None) -> None:
        for port, proc in self.instances if only is None else [self.instances[only]]:
            while not self._healthy(port):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"Aegra on port {port} did not come up:\n{self.log(port)}")
                time.sleep(1)

    def _healthy(self, port: int) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return True
        except Exception:
            return False

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.instances[i][0]}"

    def log(self, port: int) -> str:
        return (self.folder / f"aegra-{port}.log").read_text()[-4000:]

    def pids(self, i: int) -> set[int]:
        """The processes of instance ``i`` (its process group: the CLI and uvicorn)."""
        group, found = self.instances[i][1].pid, set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:  # pgrp
                found.add(int(stat.parent.name))
        return found

    def running(self) -> dict[str, int]:
        """Runs running now, and the instance whose worker loop holds each (Aegra names
        them ``<host>-<pid>-worker-<n>``; the name is cleared when the run ends)."""
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT run_id, claimed_by FROM runs WHERE status = 'running'"
            ).fetchall()
        found = {}
        for run, owner in rows:
            for i, pids in enumerate(self.instance_pids):
                if owner and any(f"-{pid}-worker-" in owner for pid in pids):
                    found[str(run)] = i
        return found

    def held_runs(self, i: int) -> list[str]:
        """Runs instance ``i`` holds now."""
        return [run for run, owner in self.running().items() if owner == i]

    def kill(self, i: int) -> None:
        """SIGKILL instance ``i`` and everything it started: no chance to hand runs back."""
        os.killpg(self.instances[i][1].pid, signal.SIGKILL)
        self.instances[i][1].wait()

    def stop(self) -> None:
        for _, proc in self.instances:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.instances:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(timeout=20)
