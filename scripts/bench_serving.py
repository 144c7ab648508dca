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

Meanwhile it samples each vLLM server's ``vllm:num_requests_running`` gauge (requests in the
engine's running batch) every 50 ms and prints, per setup and server, the batch sizes seen
while the server was busy (mean, median, 90th percentile, max) beside throughput. Prints,
asserts nothing.

Usage: python scripts/bench_serving.py [--runs 128] [--in-flight 64] [--setups local,dev,aegra]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' launchers: Postgres, the Aegra cluster

RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\}\s+([0-9.eE+-]+)", re.M)


class BatchSampler:
    """Polls the servers' running-batch gauge in a thread while a setup runs."""

    def __init__(self, urls: dict[str, str], every_s: float = 0.05):
        self.urls, self.every_s = urls, every_s
        self.samples: dict[str, list[float]] = {name: [] for name in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for name, url in self.urls.items():
                try:
                    text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
                except OSError:
                    continue
                found = RUNNING.findall(text)
                if found:
                    self.samples[name].append(sum(float(v) for v in found))

    def __enter__(self) -> BatchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, str]:
        out = {}
        for name, values in self.samples.items():
            busy = sorted(v for v in values if v > 0)
            if not busy:
                out[name] = "never busy"
                continue
            p90 = busy[int(0.9 * (len(busy) - 1))]
            out[name] = (
                f"mean {statistics.fmean(busy):5.1f}  median {statistics.median(busy):4.0f}  "
                f"p90 {p90:4.0f}  max {busy[-1]:4.0f}  ({len(busy)} busy samples)"
            )
        return out


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


def run_local(inputs: list[dict], in_flight: int) -> list[str | None]:
    from speceyes_graph.studio import make_graph

    graph = make_graph()
    outs = asyncio.run(graph.abatch(inputs, {"max_concurrency": in_flight}))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=128)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--setups", default="local,dev,aegra")
    args = parser.parse_args()

    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.models.servers import VLLMServer, start_servers

    folder = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    inputs = demo_inputs(args.runs, folder)
    paths = demo_checkpoints()
    print(f"starting vLLM servers for the demo checkpoints ({folder}) ...", flush=True)
    servers = start_servers([VLLMServer(paths[r], name=r) for r in ("small", "large")])
    by_name = {s.name: s.url.removesuffix("/v1") for s in servers}
    os.environ.update(
        SPECEYES_SMALL_URL=servers[0].url, SPECEYES_SMALL_MODEL="small",
        SPECEYES_LARGE_URL=servers[1].url, SPECEYES_LARGE_MODEL="large",
        SPECEYES_BLOB_DIR=str(folder / "blobs"), LANGSMITH_TRACING="false",
    )  # fmt: skip
    results: dict[str, tuple[float, list, dict]] = {}
    reference: list | None = None
    try:
        for setup in args.setups.split(","):
            stop = lambda: None  # noqa: E731
            if setup == "local":
                go = lambda: run_local(inputs, args.in_flight)  # noqa: E731
            elif setup == "dev":
                url, proc = start_dev(folder, args.in_flight)
                stop = lambda proc=proc: os.killpg(proc.pid, signal.SIGTERM)  # noqa: E731
                go = lambda url=url: through_sdk([url], inputs, args.in_flight)  # noqa: E731
            elif setup == "aegra":
                from aegra_cluster import AegraCluster
                from postgres_server import PostgresServer

                pg = PostgresServer(tempfile.mkdtemp(prefix="bench-serving-pg-")).start()
                cluster = AegraCluster(
                    folder / "aegra", pg.create_database("aegra"),
                    jobs_per_instance=max(1, args.in_flight // 2),
                ).start(2)  # fmt: skip

                def stop(cluster=cluster, pg=pg) -> None:
                    cluster.stop()
                    pg.stop()

                urls = [cluster.url(0), cluster.url(1)]
                go = lambda urls=urls: through_sdk(urls, inputs, args.in_flight)  # noqa: E731
            else:
                raise SystemExit(f"unknown setup {setup!r}: local, dev or aegra")
            try:
                print(f"{setup}: {args.runs} runs, {args.in_flight} in flight ...", flush=True)
                with BatchSampler(by_name) as sampler:
                    t0 = time.perf_counter()
                    answers = go()
                    wall = time.perf_counter() - t0
                results[setup] = (wall, answers, sampler.summary())
                reference = reference or answers
            finally:
                stop()
    finally:
        for server in servers:
            server.stop()

    print(f"\nbatch sizes vLLM saw while busy ({args.runs} demo runs, {args.in_flight} in flight)")
    for setup, (wall, answers, summary) in results.items():
        same = sum(a == b for a, b in zip(answers, reference or answers, strict=True))
        print(f"{setup:6s} {args.runs / wall:5.2f} runs/s  ({wall:.0f} s; answers as the first "
              f"setup: {same}/{len(answers)})")  # fmt: skip
        for name, line in summary.items():
            print(f"       {name:6s} {line}")


if __name__ == "__main__":
    main()
