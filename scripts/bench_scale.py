"""Many queries in flight in one process: what the graph costs as a client of served models.

One process drives N queries at once (``graph.batch`` and ``graph.abatch``) through the
SpecEyes graph with served clients (``ChatOpenAI`` over httpx) against a loopback
OpenAI-compatible server in another process that answers after ``--delay-ms``: the judge
says "no" for 4 queries in 5 (the paper's beta), drafts are confident, the agent answers at
once. Prints, asserts nothing:

- wall time and throughput;
- orchestration CPU per query (this process's CPU time / N: the server's is not counted);
- peak threads and memory (RSS at the start, its peak, at the end);
- the same for LangGraph's own floor: a graph of as many no-op nodes, same N, same run.

Target (issue 23): CPU per query within 2x of the floor, memory flat in the number of
queries finished.

Usage: python3 scripts/bench_scale.py [--n 1000] [--delay-ms 50] [--modes batch,abatch]
       (the server: python3 scripts/bench_scale.py --serve PORT --delay-ms D)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K = 64  # top log-probs the speculator asks for


# --- the loopback server ---------------------------------------------------------------------


def serve(port: int, delay_s: float) -> None:
    """An OpenAI-compatible chat server that answers after a delay (run in its own process)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def text_of(messages: list) -> str:
        parts = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            else:
                parts.extend(b.get("text", "") for b in content or [] if b.get("type") == "text")
        return "\n".join(parts)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(
            {"data": [{"id": n, "root": n, "max_model_len": 32768} for n in ("small", "large")]}
        )

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.sleep(delay_s)
        logprobs = None
        if body.get("logprobs"):  # the speculator: a confident "A"
            k = int(body.get("top_logprobs") or 1)
            top = [{"token": "A", "logprob": -1e-4}] + [
                {"token": f"t{i}", "logprob": -12.0 - i * 0.01} for i in range(k - 1)
            ]
            content, logprobs = (
                "A",
                {"content": [{"token": "A", "logprob": -1e-4, "top_logprobs": top}]},
            )
        elif body.get("max_completion_tokens") == 10 or body.get("max_tokens") == 10:  # judge
            content = "yes" if "(tools)" in text_of(body["messages"]) else "no"
        else:  # the agent answers at once
            content = "<think>I can see it.</think> <answer>A</answer>"
        usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }
        if logprobs:
            choice["logprobs"] = logprobs
        return JSONResponse(
            {"id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
             "choices": [choice], "usage": usage}
        )  # fmt: skip

    app = Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", backlog=4096, limit_concurrency=10000
    )


def start_server(delay_ms: float) -> tuple[subprocess.Popen, str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--delay-ms", str(delay_ms)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(200):
        try:
            if httpx.get(url + "/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the loopback server did not start")


# --- measuring -----------------------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    """Peak threads and memory while a run goes (a 10 ms sampling thread)."""

    def __init__(self):
        self.threads, self.rss = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.01):
            self.threads = max(self.threads, threading.active_count() - 1)
            self.rss.append(rss_mb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(label: str, run, n: int) -> dict:
    start_rss = rss_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    with Sampler() as sampler:
        outs = run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    errors = sum(1 for o in outs if isinstance(o, dict) and o.get("error"))
    routes = Counter(o.get("route") for o in outs if isinstance(o, dict) and "route" in o)
    row = {
        "label": label, "n": n, "wall_s": wall, "qps": n / wall, "cpu_ms_per_q": 1000 * cpu / n,
        "threads": sampler.threads, "rss_start": start_rss,
        "rss_peak": max(sampler.rss or [start_rss]), "rss_end": rss_mb(), "errors": errors,
    }  # fmt: skip
    print(
        f"{label:<28} {n:>5} {wall:>7.2f} s {row['qps']:>8.1f} q/s {row['cpu_ms_per_q']:>7.2f} ms CPU/q"
        f" {row['threads']:>4} threads  RSS {start_rss:.0f} -> peak {row['rss_peak']:.0f} -> {row['rss_end']:.0f} MB"
        + (f"  ({errors} errors)" if errors else "")
        + (f"  routes {dict(routes)}" if routes else ""),
        flush=True,
    )
    first_error = next((o["error"] for o in outs if isinstance(o, dict) and o.get("error")), None)
    if first_error:
        print(f"{'':<28} first error: {first_error[:300]}")
    return row


# --- the graphs ----------------------------------------------------------------------------


def speceyes_graph(url: str):
    from speceyes_graph import GateConfig, create_speceyes_graph
    from speceyes_graph.models import openai_chat_model
    from speceyes_tools import ResizeSpec

    resize = ResizeSpec(max_pixels=256 * 28 * 28)
    small = openai_chat_model(
        url, "small", top_logprobs=K, resize=resize, probe=False, max_retries=0
    )
    large = openai_chat_model(url, "large", resize=resize, probe=False, max_retries=0)
    return create_speceyes_graph(
        speculator=small, agent=large, gate=GateConfig(tau=0.98, k=K), max_agent_steps=2
    ).compile()


def floor_graph(n_nodes: int, asynchronous: bool):
    """LangGraph's own cost: as many no-op nodes in a line (async ones for abatch)."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict, total=False):
        question: str
        step: int

    def noop(state):
        return {"step": state.get("step", 0) + 1}

    async def anoop(state):
        return {"step": state.get("step", 0) + 1}

    graph = StateGraph(S)
    names = [f"n{i}" for i in range(n_nodes)]
    for name in names:
        graph.add_node(name, anoop if asynchronous else noop)
    graph.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        graph.add_edge(a, b)
    graph.add_edge(names[-1], END)
    return graph.compile()


def queries(n: int) -> list[dict]:
    """N queries over 32 small distinct images; 1 in 5 asks for tools (the judge says yes)."""
    from PIL import Image

    images = []
    for i in range(32):
        buf = io.BytesIO()
        Image.new("RGB", (320, 240), (8 * i, 255 - 8 * i, 100)).save(buf, format="PNG")
        images.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return [
        {
            "question": f"What colour is the square? q{i}" + (" (tools)" if i % 5 == 0 else ""),
            "images": [images[i % 32]],
            "options": ["red", "green"],
        }
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="queries in flight")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="the server's answer delay")
    parser.add_argument("--modes", default="batch,abatch")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.delay_ms / 1000)
        return
    modes = args.modes.split(",")
    n = args.n
    proc, url = start_server(args.delay_ms)
    try:
        graph = speceyes_graph(url)
        inputs = queries(n)
        nodes = len(graph.get_graph().nodes) - 2  # without __start__ and __end__
        floor, afloor = floor_graph(nodes, False), floor_graph(nodes, True)
        graph.invoke(inputs[0])  # warm: imports, clients, connection pools
        floor.invoke({"question": "x"})
        config = {"max_concurrency": n}
        print(f"{n} queries in flight, server delay {args.delay_ms:.0f} ms, {os.cpu_count()} CPUs")
        print(f"{'':<28} {'n':>5} {'wall':>9} {'throughput':>12} {'CPU':>14}")
        for mode in modes:
            if mode == "batch":
                measure("speceyes graph.batch", lambda: graph.batch(inputs, config), n)
                measure(
                    f"floor ({nodes} no-op nodes) batch",
                    lambda: floor.batch([{"question": "x"}] * n, config),
                    n,
                )
            else:
                measure(
                    "speceyes graph.abatch", lambda: asyncio.run(graph.abatch(inputs, config)), n
                )
                measure(
                    f"floor ({nodes} no-op nodes) abatch",
                    lambda: asyncio.run(afloor.abatch([{"question": "x"}] * n, config)),
                    n,
                )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
