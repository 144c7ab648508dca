"""Does batching survive the serving engine? The batch sizes vLLM sees under served graphs.

The graph batches across queries by keeping many of them in flight against the model
servers; a LangGraph server stands between the clients and the graph, and must keep as many
runs in flight for the servers to see the same batches. This script starts the shipped demo
checkpoints on two real vLLM servers (``bash scripts/setup-vllm.sh``), then puts the same
demo queries through three setups, ``--in-flight`` runs at a time:

- ``local``: ``graph.abatch`` in this process (no server between: the reference);
- ``dev``: ``langgraph dev`` (one process, ``--n-jobs-per-worker`` = in-flight), clients
  through ``langgraph_sdk``;
- ``aegra``: two Aegra instances over PostgreSQL and Redis (``bash scripts/setup-aegra.sh``;
  ``WORKER_COUNT=1``, ``N_JOBS_PER_WORKER`` = in-flight / 2 each), clients split between them.

From each vLLM server's own counters before and after (``/metrics``) it prints, per setup
and server, the mean batch per engine step (tokens generated / engine steps: each request in
a step's batch generates one token; exact, not sampled) and the mean number of requests
running over the wall time, beside throughput and where
the machine's CPU went (per process group: vLLM, the LangGraph server, Postgres + Redis, the
rest). Prints, asserts nothing.

The setups run in turn, ``--rounds`` times (the figures of one round vary a lot on a small
machine). ``--models local`` puts the demo checkpoints in each graph process instead (no vLLM): then
``dev`` against ``local`` is what a LangGraph server costs over ``graph.abatch`` when the
runs it holds at once share the batch workers.

Usage: python scripts/bench_serving.py [--runs 128] [--in-flight 64] [--rounds 3]
    [--setups local,dev,aegra] [--models vllm|local]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' launchers: Postgres, the Aegra cluster

TICK = os.sysconf("SC_CLK_TCK")
# one event loop for every local round: the model clients keep their connection pools on it
LOOP = asyncio.new_event_loop()


def cpu_by_group() -> tuple[dict[int | str, float], float, float]:
    """CPU seconds so far of every process group (with their waited-for children) and of
    every user name's processes (``"user:postgres"``: Postgres puts each backend in a group
    of its own), and the machine's busy and total seconds (all cores) from /proc/stat."""
    import pwd

    groups: dict[int | str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            user = "user:" + pwd.getpwuid(stat.stat().st_uid).pw_name
        except (OSError, KeyError):
            continue
        pgrp, used = int(fields[2]), sum(int(f) for f in fields[11:15]) / TICK  # utime..cstime
        groups[pgrp] = groups.get(pgrp, 0.0) + used
        groups[user] = groups.get(user, 0.0) + used
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = cpu[3] + cpu[4]
    return groups, (sum(cpu) - idle) / TICK, sum(cpu) / TICK


class CpuAccount:
    """Where the machine's CPU went during a setup: per named process group, the rest."""

    def __init__(self, named: dict[str, list[int | str]]):
        self.named = named  # label -> process group ids or "user:NAME"

    def __enter__(self) -> CpuAccount:
        self.before = cpu_by_group()
        return self

    def __exit__(self, *exc) -> None:
        after = cpu_by_group()
        (g0, busy0, total0), (g1, busy1, total1) = self.before, after
        self.busy_s, self.share = busy1 - busy0, (busy1 - busy0) / max(total1 - total0, 1e-9)
        self.by_label = {
            label: sum(g1.get(g, 0.0) - g0.get(g, 0.0) for g in ids)
            for label, ids in self.named.items()
        }
        self.by_label["everything else"] = self.busy_s - sum(self.by_label.values())

    def line(self) -> str:
        parts = ", ".join(f"{label} {sec:.0f} s" for label, sec in self.by_label.items())
        return f"CPU {self.busy_s:.0f} s, machine {100 * self.share:.0f}% busy: {parts}"


def engine_counters(url: str) -> dict[str, float]:
    """vLLM's own counters (``/metrics``), summed over their labels: engine steps, tokens
    generated (one per request in each step's batch), requests finished, and seconds
    requests spent in the running batch."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    wanted = {
        "steps": "vllm:iteration_tokens_total_count",
        "tokens": "vllm:generation_tokens_total",
        "requests": "vllm:request_success_total",
        "running_s": "vllm:request_inference_time_seconds_sum",
    }
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, metric in wanted.items():
            if name == metric:
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


class BatchCounter:
    """What each server did during a setup, from the difference of its counters: the mean
    batch per engine step (tokens generated / steps: each request in a step's batch
    generates one token) and the mean number of requests running over the wall time."""

    def __init__(self, urls: dict[str, str]):
        self.urls = urls

    def __enter__(self) -> BatchCounter:
        self.before = {name: engine_counters(url) for name, url in self.urls.items()}
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.t0
        self.lines = {}
        for name, url in self.urls.items():
            after = engine_counters(url)
            d = {k: after[k] - self.before[name][k] for k in after}
            per_step = d["tokens"] / d["steps"] if d["steps"] else 0.0
            self.lines[name] = (
                f"{d['requests']:5.0f} requests in {d['steps']:5.0f} engine steps: "
                f"{per_step:5.1f} requests per step; {d['running_s'] / wall:5.1f} running on "
                f"average over the wall time"
            )


def demo_inputs(n: int, folder: Path) -> list[dict]:
    from speceyes_graph.demo import demo_queries

    return [
        {
            "question": q.question,
            "images": [
                "data:image/png;base64," + base64.b64encode(Path(q.image).read_bytes()).decode()
            ],
            "options": q.options,
        }
        for q in demo_queries(folder, n, micro_share=0.0)
    ]


def through_sdk(urls: list[str], inputs: list[dict], in_flight: int) -> list[str | None]:
    """``in_flight`` client threads, each creating a run on a new thread and waiting for it;
    client ``i`` talks to ``urls[i % len(urls)]``. Returns the answers in input order."""
    from langgraph_sdk import get_sync_client

    clients = [get_sync_client(url=u, timeout=600) for u in urls]

    def one(i: int) -> str | None:
        client = clients[i % len(clients)]
        thread = client.threads.create()["thread_id"]
        out = client.runs.wait(thread, "speceyes", input=inputs[i])
        return out.get("answer") if isinstance(out, dict) else None

    with ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(one, range(len(inputs))))


def run_local(graph, inputs: list[dict], in_flight: int) -> list[str | None]:
    outs = LOOP.run_until_complete(graph.abatch(inputs, {"max_concurrency": in_flight}))
    return [o.get("answer") for o in outs]


def start_dev(folder: Path, in_flight: int) -> tuple[str, subprocess.Popen]:
    from aegra_cluster import free_port

    port = free_port()
    log = open(folder / "dev.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "langgraph_cli", "dev", "--port", str(port), "--host", "127.0.0.1",
         "--no-browser", "--no-reload", "--n-jobs-per-worker", str(in_flight)],
        cwd=ROOT, env={**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(url + "/ok", timeout=2)
            return url, proc
        except OSError:
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"langgraph dev did not start:\n{(folder / 'dev.log').read_text()[-3000:]}")


def start_setup(
    setup: str, inputs: list[dict], in_flight: int, folder: Path, cleanup: ExitStack
) -> tuple[Callable[[], list], dict[str, list[int | str]]]:
    """Start what a setup needs (stopped by ``cleanup``); returns how to run the load on it
    and the process groups it adds."""
    if setup == "local":
        from speceyes_graph.integrations.studio import make_graph

        graph = make_graph()
        return lambda: run_local(graph, inputs, in_flight), {"graph (this process)": [os.getpgrp()]}
    if setup == "dev":
        url, proc = start_dev(folder, in_flight)
        cleanup.callback(os.killpg, proc.pid, signal.SIGTERM)
        return lambda: through_sdk([url], inputs, in_flight), {"langgraph dev": [proc.pid]}
    if setup == "aegra":
        from aegra_cluster import AegraCluster
        from postgres_server import PostgresServer

        pg = PostgresServer(tempfile.mkdtemp(prefix="bench-serving-pg-")).start()
        cleanup.callback(pg.stop)
        cluster = AegraCluster(
            folder / "aegra", pg.create_database("aegra"), jobs_per_instance=max(1, in_flight // 2)
        ).start(2)
        cleanup.callback(cluster.stop)
        urls = [cluster.url(0), cluster.url(1)]
        groups: dict[str, list[int | str]] = {
            "Aegra instances": [proc.pid for _, proc in cluster.instances],
            "Postgres + Redis": ["user:postgres", cluster.redis.pid],
        }
        return lambda: through_sdk(urls, inputs, in_flight), groups
    raise SystemExit(f"unknown setup {setup!r}: local, dev or aegra")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=128)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--setups", default="local,dev,aegra")
    parser.add_argument("--rounds", type=int, default=3, help="each setup in turn, this often")
    parser.add_argument(
        "--models",
        choices=["vllm", "local"],
        default="vllm",
        help="the demo checkpoints on two vLLM servers, or local in each graph process "
        "(transformers, batched across the runs a worker holds)",
    )
    args = parser.parse_args()

    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.models.servers import VLLMServer, start_servers

    folder = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    inputs = demo_inputs(args.runs, folder)
    paths = demo_checkpoints()
    os.environ.update(SPECEYES_BLOB_DIR=str(folder / "blobs"), LANGSMITH_TRACING="false")
    servers = []
    if args.models == "vllm":
        print(f"starting vLLM servers for the demo checkpoints ({folder}) ...", flush=True)
        servers = start_servers([VLLMServer(paths[r], name=r) for r in ("small", "large")])
        os.environ.update(
            SPECEYES_SMALL_URL=servers[0].url, SPECEYES_SMALL_MODEL="small",
            SPECEYES_LARGE_URL=servers[1].url, SPECEYES_LARGE_MODEL="large",
        )  # fmt: skip
    else:
        os.environ.update(
            SPECEYES_SMALL_PATH=str(paths["small"]), SPECEYES_LARGE_PATH=str(paths["large"])
        )
    by_name = {s.name: s.url.removesuffix("/v1") for s in servers}
    vllm_groups: dict[str, list[int | str]] = (
        {"vLLM servers": [s.process.pid for s in servers]} if servers else {}
    )
    reference: list | None = None
    walls: dict[str, list[float]] = {}
    with ExitStack() as cleanup:
        for server in servers:
            cleanup.callback(server.stop)
        started = {}
        for setup in args.setups.split(","):
            print(f"starting {setup} ...", flush=True)
            started[setup] = start_setup(setup, inputs, args.in_flight, folder, cleanup)
        print(f"\nbatches vLLM ran ({args.runs} demo runs, {args.in_flight} in flight)")
        for round_ in range(1, args.rounds + 1):
            for setup, (go, groups) in started.items():
                with CpuAccount({**vllm_groups, **groups}) as cpu, BatchCounter(by_name) as batches:
                    t0 = time.perf_counter()
                    answers = go()
                    wall = time.perf_counter() - t0
                walls.setdefault(setup, []).append(wall)
                reference = reference or answers
                same = sum(a == b for a, b in zip(answers, reference, strict=True))
                print(f"round {round_} {setup:6s} {args.runs / wall:5.2f} runs/s ({wall:.0f} s; "
                      f"answers as the first run: {same}/{len(answers)})")  # fmt: skip
                for name, line in batches.lines.items():
                    print(f"       {name:6s} {line}")
                print(f"       {cpu.line()}", flush=True)
        if "local" in walls:
            best = min(walls["local"])
            for setup, times in walls.items():
                if setup != "local":
                    print(f"{setup} vs local (best of {len(times)} rounds each): "
                          f"{min(times) / best:.2f}x the in-process time")  # fmt: skip


if __name__ == "__main__":
    main()
