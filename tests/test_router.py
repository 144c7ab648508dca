"""Replicas behind a router (``-m vllm``): the graph over ``vllm-router`` in front of the vLLM
servers the suite starts, plus a second replica of the large model.

One router per model (``cache_aware`` over the two large replicas, ``round_robin`` over the
small server): the graph gives what it gives on the transformers path, query by query, and
both replicas serve; a replica SIGKILLed in the middle of a batch loses no query (the router
sends its requests to the other). One router for every model (``--enable-igw``) lists its
models its own way, so a served model behind it whose frame cannot be established is refused
when it is built, and its top-log-probs check still runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass

import pytest

pytest.importorskip("langchain_openai", reason="the openai extra")

from engine_parity import assert_same, local_run, run_configuration  # noqa: E402

from speceyes_graph.demo import demo_checkpoints  # noqa: E402
from speceyes_graph.demo.engines import served_models  # noqa: E402
from speceyes_graph.models import openai_chat_model  # noqa: E402
from speceyes_graph.models.served import ServedModelError  # noqa: E402
from speceyes_graph.models.servers import VLLMRouter, VLLMServer, start_servers  # noqa: E402
from speceyes_tools.images import ResizeSpec  # noqa: E402

pytestmark = pytest.mark.vllm
TOOL_PARSER = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # as conftest's


@dataclass
class Fleet:
    large: VLLMServer  # the session's large server
    replica: VLLMServer  # a second replica of it, ours to kill
    small_router: VLLMRouter
    large_router: VLLMRouter
    igw_router: VLLMRouter  # one router for both models

    def models(self) -> dict:
        """The graph's models, each through its own router."""
        urls = {"small": self.small_router.url, "large": self.large_router.url}
        return served_models(urls, {"small": "small", "large": "large"})


@pytest.fixture(scope="module")
def fleet(vllm_servers):
    """A second large replica (started as the session's large server is), a router per
    model, and one IGW router for both; stopped at the module's end."""
    small, large = vllm_servers["small"], vllm_servers["large"]
    replica = VLLMServer(demo_checkpoints()["large"], name="large", extra_args=TOOL_PARSER)
    routers = [
        VLLMRouter([small], policy="round_robin"),
        VLLMRouter([large, replica], policy="cache_aware"),
        VLLMRouter([small, large], igw=True),
    ]
    started = []
    try:
        started += start_servers([replica])
        started += start_servers(routers)
        yield Fleet(large, replica, *routers)
    finally:
        for server in started:
            server.stop()


def finished_requests(server: VLLMServer) -> float:
    """Requests a vLLM server has finished (its Prometheus counter)."""
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    prefix = "vllm:request_success_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def test_the_graph_over_one_router_per_model_matches_the_transformers_path(
    demo_local, fleet, demo_queries_60
):
    before = {s: finished_requests(s) for s in (fleet.large, fleet.replica)}
    served_run = run_configuration(fleet.models(), "speceyes", demo_queries_60)
    assert_same(local_run(demo_local, "speceyes", demo_queries_60), served_run)
    served = {s: finished_requests(s) - before[s] for s in before}
    assert all(n > 0 for n in served.values()), served  # the router used both replicas


def test_a_replica_killed_mid_batch_loses_no_query(demo_local, fleet, demo_queries_60):
    """Agent-only (every query to the large model, several turns each); once the replica
    has finished a few requests it is SIGKILLed with the batch under way."""
    start = finished_requests(fleet.replica)
    killed: dict[str, float] = {}

    def kill_when_busy():
        deadline = time.time() + 120
        while time.time() < deadline and finished_requests(fleet.replica) < start + 3:
            time.sleep(0.1)
        os.killpg(fleet.replica.process.pid, signal.SIGKILL)
        killed["at"] = time.time()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    t0 = time.time()
    served_run = run_configuration(fleet.models(), "agent", demo_queries_60)
    ended = time.time()
    killer.join(30)
    assert t0 < killed["at"] < ended  # the batch was still running when the replica died
    assert_same(local_run(demo_local, "agent", demo_queries_60), served_run)  # no query lost


def test_one_router_for_every_model_is_refused_where_the_frame_is_unknown(fleet):
    """vllm-router --enable-igw answers /v1/models with {"models": [...]}: no checkpoint, and
    'small' names no family, so the client is refused, saying how to go on; each way on
    builds it, and the top-log-probs check runs whatever the listing says."""
    igw = fleet.igw_router.url
    assert sorted(fleet.igw_router.models()) == ["large", "small"]
    with pytest.raises(ServedModelError, match="not OpenAI's listing") as refused:
        openai_chat_model(igw, "small", top_logprobs=64)
    for fix in ("resize=", "?max_pixels=", "default_frame=True", "one router"):
        assert fix in str(refused.value)
    assert openai_chat_model(igw, "small", top_logprobs=64, default_frame=True).resize_spec == ResizeSpec()
    frame = ResizeSpec(factor=32, min_pixels=16384, max_pixels=16384)
    assert openai_chat_model(igw, "small", top_logprobs=64, resize=frame).resize_spec is frame
    with pytest.raises(ServedModelError, match="refuses top_logprobs=65"):
        openai_chat_model(igw, "small", top_logprobs=65, default_frame=True)  # the servers cap 64
