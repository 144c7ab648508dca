"""Many queries in flight in one process: what the graph costs as a client of served models.

One process drives N queries at once (``graph.batch`` and ``graph.abatch``) through the
SpecEyes graph, with two kinds of model client (``--clients``):

- ``openai``: ``ChatOpenAI`` over httpx against a loopback OpenAI-compatible server in
  another process that answers after ``--delay-ms``;
- ``scripted``: in-process scripted models that answer after the same delay (``asyncio.sleep``
  under ``abatch``): the graph's own orchestration, without an HTTP client's cost.

The judge says "no" for 4 queries in 5 (the paper's beta), drafts are confident, the agent
answers at once. Prints, asserts nothing: wall time and throughput; CPU per query (this
process's CPU time / N: the server's is not counted); peak threads and memory (RSS at the
start, its peak, at the end); the same for LangGraph's own floor, a graph of as many no-op
nodes, same N, same run. Targets (issue 23): CPU per query within 2x of the floor, memory
flat in the number of queries finished.

``--engine vllm``: the demo checkpoints on two real vLLM servers (``bash
scripts/setup-vllm.sh`` first); ``abatch`` of ``--vllm-n`` demo queries at concurrency 64
against the very same requests (recorded from the graph) sent straight to the servers by a
OpenAI SDK's own client (``AsyncOpenAI``, same retries), each query's requests in order, 64
queries at a time. Target (issue 46): the graph reaches the raw client's throughput (1.0).

Usage: python3 scripts/bench_scale.py [--n 1000] [--delay-ms 50] [--modes batch,abatch]
           [--clients openai,scripted] [--engine vllm --vllm-n 256]
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
_LOOP = asyncio.new_event_loop()  # one loop for every async run: clients keep their pools


def run_async(coroutine):
    return _LOOP.run_until_complete(coroutine)


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
        f"{label:<34} {n:>5} {wall:>7.2f} s {row['qps']:>8.1f} q/s {row['cpu_ms_per_q']:>7.2f} ms CPU/q"
        f" {row['threads']:>4} threads  RSS {start_rss:.0f} -> peak {row['rss_peak']:.0f} -> {row['rss_end']:.0f} MB"
        + (f"  ({errors} errors)" if errors else "")
        + (f"  routes {dict(routes)}" if routes else ""),
        flush=True,
    )
    first_error = next((o["error"] for o in outs if isinstance(o, dict) and o.get("error")), None)
    if first_error:
        print(f"{'':<34} first error: {first_error[:300]}")
    return row


# --- the graphs ----------------------------------------------------------------------------


def speceyes_graph(url: str):
    from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
    from speceyes_graph.models import openai_chat_model
    from speceyes_tools import ResizeSpec

    resize = ResizeSpec(max_pixels=256 * 28 * 28)
    small = openai_chat_model(
        url, "small", top_logprobs=K, resize=resize, probe=False, max_retries=0
    )
    large = openai_chat_model(url, "large", resize=resize, probe=False, max_retries=0)
    return create_speceyes_graph(
        speculator=small, agent=large, gate=GateConfig(tau=0.98, k=K), loop=LoopOptions(max_steps=2)
    ).compile()


def scripted_graph(delay_s: float):
    """The same graph and replies as the loopback server's, from in-process scripted models."""
    from langchain_core.messages import AIMessage

    from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
    from speceyes_graph.models import ScriptedChatModel
    from speceyes_graph.protocol import message_text

    def said(messages) -> str:
        return "".join(message_text(m) for m in messages if m.type == "human")

    top = [{"token": "A", "logprob": -1e-4}] + [
        {"token": f"t{i}", "logprob": -12.0 - i * 0.01} for i in range(K - 1)
    ]
    logprobs = {"content": [{"token": "A", "logprob": -1e-4, "top_logprobs": top}]}
    small = ScriptedChatModel(
        respond=lambda m: AIMessage(content="A", response_metadata={"logprobs": logprobs}),
        delay_s=delay_s,
    )
    large = ScriptedChatModel(respond=lambda m: "<answer>B</answer>", delay_s=delay_s)
    return create_speceyes_graph(
        judge=ScriptedChatModel(
            respond=lambda m: "yes" if "(tools)" in said(m) else "no", delay_s=delay_s
        ),
        speculator=small,
        agent=large,
        gate=GateConfig(tau=0.98, k=K),
        loop=LoopOptions(max_steps=2),
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


# --- against real vLLM ------------------------------------------------------------------------


def sdk_http():
    """The HTTP package the OpenAI SDK sends with (its own fork of httpx, in recent ones)."""
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http
    return http


def record_requests(graph, inputs: list[dict], concurrency: int) -> list[list[tuple[str, bytes]]]:
    """Each query's HTTP requests, in order, as the graph sends them (a warm-up run too)."""
    import contextvars

    client_class = sdk_http().AsyncClient
    query = contextvars.ContextVar("query", default=None)
    sent: dict[int, list] = {i: [] for i in range(len(inputs))}
    original = client_class.send

    async def send(self, request, **kwargs):
        if query.get() is not None:
            sent[query.get()].append((str(request.url), request.content))
        return await original(self, request, **kwargs)

    async def run():
        gate = asyncio.Semaphore(concurrency)

        async def one(i, q):
            async with gate:
                query.set(i)
                return await graph.ainvoke(q)

        return await asyncio.gather(*(one(i, q) for i, q in enumerate(inputs)))

    client_class.send = send
    try:
        run_async(run())
    finally:
        client_class.send = original
    return [sent[i] for i in range(len(inputs))]


async def replay(recorded: list[list[tuple[str, bytes]]], concurrency: int) -> list[dict]:
    """The recorded requests straight to the servers: ``concurrency`` queries at a time, each
    query's requests in order (as the graph sends them), every reply read and parsed."""
    httpx = sdk_http()  # the same client the graph's requests went through
    headers = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY"}
    todo = iter(range(len(recorded)))
    done: list[dict] = []
    limits = httpx.Limits(
        max_connections=2 * concurrency, max_keepalive_connections=2 * concurrency
    )
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def worker():
            for i in todo:  # one iterator shared by the workers
                error = None
                for url, body in recorded[i]:
                    reply = await client.post(url, content=body, headers=headers)
                    if reply.status_code != 200:
                        error = f"HTTP {reply.status_code}: {reply.text[:200]}"
                    reply.json()
                done.append({"error": error})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def as_openai_calls(recorded: list[list[tuple[str, bytes]]]) -> list[list[tuple[str, dict]]]:
    """Each recorded request as (server base URL, JSON body), parsed once, before timing."""
    import json

    return [
        [(url.rsplit("/chat/completions", 1)[0], json.loads(body)) for url, body in query]
        for query in recorded
    ]


async def replay_openai(calls: list[list[tuple[str, dict]]], concurrency: int) -> list[dict]:
    """The recorded requests sent by the OpenAI SDK's own client (``AsyncOpenAI``, one per
    server, the graph's retries and timeout): ``concurrency`` queries at a time, each
    query's requests in order, every reply parsed into a ``ChatCompletion``."""
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion

    clients = {
        base: AsyncOpenAI(base_url=base, api_key="EMPTY", max_retries=3, timeout=300)
        for base in {base for query in calls for base, _ in query}
    }
    todo = iter(range(len(calls)))
    done: list[dict] = []

    async def worker():
        for i in todo:  # one iterator shared by the workers
            error = None
            for base, body in calls[i]:
                try:
                    await clients[base].post("/chat/completions", body=body, cast_to=ChatCompletion)
                except Exception as exc:  # noqa: BLE001 - counted, as the graph records its own
                    error = repr(exc)
            done.append({"error": error})

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        for client in clients.values():
            await client.close()
    return done


def vllm_comparison(n: int, concurrency: int, repeat: int) -> None:
    import tempfile

    from speceyes_graph.demo import demo_checkpoints, demo_graph, demo_queries
    from speceyes_graph.demo.engines import demo_engine

    with tempfile.TemporaryDirectory() as tmp, demo_engine("vllm", demo_checkpoints()) as engine:
        print(engine.description)
        graph = demo_graph(engine.models["small"], engine.models["large"]).compile()
        inputs = [
            {"question": q.question, "images": [q.image], "options": q.options}
            for q in demo_queries(Path(tmp), n, seed=7)
        ]
        recorded = record_requests(graph, inputs, concurrency)
        calls = as_openai_calls(recorded)
        requests = sum(map(len, recorded))
        print(
            f"{n} demo queries, {requests} requests ({requests / n:.2f} per query), "
            f"concurrency {concurrency}, {os.cpu_count()} CPUs (servers included)"
        )
        config = {"max_concurrency": concurrency}
        ratios = []
        for _ in range(repeat):  # alternating, so neither side always meets a warmer server
            graph_row = measure(
                "speceyes graph.abatch", lambda: run_async(graph.abatch(inputs, config)), n
            )
            raw_row = measure(
                "AsyncOpenAI, same requests",
                lambda: run_async(replay_openai(calls, concurrency)),
                n,
            )
            ratios.append(graph_row["qps"] / raw_row["qps"])
            print(f"{'':<34} graph / raw throughput: {ratios[-1]:.3f} (target: 1.0)")
        ratios.sort()
        print(f"graph / raw throughput over {repeat} pairs: median {ratios[len(ratios) // 2]:.3f}, "
              f"range {ratios[0]:.3f}-{ratios[-1]:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="queries in flight")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="the models' answer delay")
    parser.add_argument("--modes", default="batch,abatch")
    parser.add_argument("--clients", default="openai,scripted", help="openai, scripted or both")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each mode")
    parser.add_argument("--engine", choices=["none", "vllm"], default="none")
    parser.add_argument("--vllm-n", type=int, default=256, help="demo queries against vLLM")
    parser.add_argument("--concurrency", type=int, default=64, help="queries in flight on vLLM")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.delay_ms / 1000)
        return
    if args.engine == "vllm":
        vllm_comparison(args.vllm_n, args.concurrency, args.repeat)
        return
    n = args.n
    inputs = queries(n)
    print(f"{n} queries in flight, model delay {args.delay_ms:.0f} ms, {os.cpu_count()} CPUs")
    print(f"{'':<34} {'n':>5} {'wall':>9} {'throughput':>12} {'CPU':>14}")
    for client in args.clients.split(","):
        proc = None
        if client == "openai":
            proc, url = start_server(args.delay_ms)
            graph = speceyes_graph(url)
        else:
            graph = scripted_graph(args.delay_ms / 1000)
        try:
            run_modes(graph, client, inputs, args.modes.split(","), args.repeat)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)


def run_modes(graph, client: str, inputs: list[dict], modes: list[str], repeat: int) -> None:
    """Each mode ``repeat`` times, the floor right after each run (the machine's state
    drifts within a minute; the ratio is taken run by run)."""
    n = len(inputs)
    nodes = len(graph.get_graph().nodes) - 2  # without __start__ and __end__
    floor, afloor = floor_graph(nodes, False), floor_graph(nodes, True)
    graph.invoke(inputs[0])  # warm: imports, clients, connection pools
    run_async(graph.ainvoke(inputs[1]))
    floor.invoke({"question": "x"})
    config = {"max_concurrency": n}
    floor_inputs = [{"question": "x"}] * n
    recorded = record_requests(graph, inputs, n) if client == "openai" else None
    for mode in modes:
        for _ in range(repeat):
            if mode == "batch":
                row = measure(f"{client}: graph.batch", lambda: graph.batch(inputs, config), n)
                base = measure(
                    f"floor ({nodes} no-op nodes) batch",
                    lambda: floor.batch(floor_inputs, config),
                    n,
                )
            else:
                row = measure(
                    f"{client}: graph.abatch", lambda: run_async(graph.abatch(inputs, config)), n
                )
                base = measure(
                    f"floor ({nodes} no-op nodes) abatch",
                    lambda: run_async(afloor.abatch(floor_inputs, config)),
                    n,
                )
            ratio = row["cpu_ms_per_q"] / base["cpu_ms_per_q"]
            print(f"{'':<34} CPU per query / floor: {ratio:.2f}")
            if recorded is not None and mode == "abatch":  # the same requests, no graph
                raw = measure("openai: raw HTTP client", lambda: run_async(replay(recorded, n)), n)
                extra = row["cpu_ms_per_q"] - raw["cpu_ms_per_q"]
                print(f"{'':<34} the graph and ChatOpenAI over the raw client: {extra:.2f} ms/q")


if __name__ == "__main__":
    main()
