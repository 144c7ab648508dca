"""The graphs ``langgraph dev`` / LangGraph Platform serve (see ``langgraph.json``).

- ``speceyes``: the SpecEyes graph (question, images, options in; answer, route, evidence out);
- ``speceyes_chat``: the same models behind a chat front (Studio's chat view, chat UIs);
- ``speceyes_example``: the offline example's scripted models, for a look at the workflow;
- ``speceyes_agent``: LangChain's ``create_agent`` over the large model and the tools, with
  :class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware` in front (what SpecEyes looks like
  in front of an agent you already have): a chat whose turns are judged, drafted and gated,
  the rest answered by the agent with native tool calls;
- ``speceyes_online``: ``speceyes`` with the online gate
  (:class:`~speceyes_graph.gate.online.OnlineGate`): tau follows the labels production gives
  so the risk stays at ``SPECEYES_MAX_RISK`` (0.02), shadow-verifying ``SPECEYES_SHADOW_RATE``
  (the gate's default) of accepted drafts; its observations live in the server's store
  (Aegra's and LangGraph Platform's PostgreSQL, ``langgraph dev``'s own), so every worker and
  instance shares one gate. ``SPECEYES_GATE_WINDOW`` (2000) and ``SPECEYES_GATE_WARMUP`` (the
  gate's) set its window and the queries it sees before tau moves; a new deployment accepts
  nothing until then (``SPECEYES_GATE_START_TAU``, 1.0) unless ``SPECEYES_GATE_EVIDENCE``
  names a gate file whose labelled queries seed it; ``SPECEYES_GATE_MAX_SHARE`` (0.05, or
  ``none``) bounds the share of its window one caller may hold. ``SPECEYES_GATE_KEY`` (the
  same secret on every worker) signs its entries: only those count, and without it the gate
  keeps to each worker's memory (docs/deployment.md, "The online gate's state").

Models come from the environment, so the same file serves a laptop and a cluster:

- ``SPECEYES_SMALL_URL``, ``SPECEYES_SMALL_MODEL``, ``SPECEYES_LARGE_URL``,
  ``SPECEYES_LARGE_MODEL``: OpenAI-compatible servers (vLLM / SGLang, or a router in front
  of replicas), asked at start-up which checkpoints they serve (image frame, context length;
  a speculator's server with too few log-probs fails the start with the flag to set, and so
  does one whose frame cannot be established: ``SPECEYES_DEFAULT_FRAME=1`` accepts 1 MP);
  the shipped demo checkpoints behind servers get the prompts they were trained on;
- else ``SPECEYES_SMALL_PATH`` and ``SPECEYES_LARGE_PATH``: local checkpoints
  (transformers);
- else ``SPECEYES_MODELS=example``: the scripted example models;
- else the demo checkpoints shipped in the package, with the prompts they were trained on,
  so ``langgraph dev`` answers questions with no setup and no downloads.

A served graph is called by strangers, so it is strict by default (see docs/deployment.md):
images only as ``data:`` URLs or public ``https`` URLs (``SPECEYES_IMAGE_DIRS`` allow-lists
folders, ``SPECEYES_IMAGE_HOSTS`` hosts), crops and pasted images kept in
``SPECEYES_BLOB_URL`` (``postgresql://...``, ``s3://...``: shared by every worker) or as files
under ``SPECEYES_BLOB_DIR`` (default ``.langgraph_api/speceyes-blobs``), bounded by
``SPECEYES_BLOB_MAX_MB`` (2048) and ``SPECEYES_BLOB_MAX_AGE_H``, and a failed query fails
its run (``SPECEYES_ON_ERROR=record`` returns it with ``error`` set instead).
``SPECEYES_TAU``, ``SPECEYES_TOP_K`` and ``SPECEYES_TOOLS`` set defaults; a run may set
only what ``SPECEYES_CLIENT_SETTINGS`` allows (``on_error`` unless it says more), and a run
naming anything else fails (:func:`client_settings`). ``SPECEYES_BATCH_SIZE`` (16)
bounds a local model's batches; the server runs at most ``--n-jobs-per-worker`` runs at
once per worker, which bounds them too (docs/deployment.md, "Scale out"). Imports are absolute because the
LangGraph CLI loads this file by path.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from typing import Any

from speceyes_graph.gate.keys import ENV as GATE_KEY_ENV
from speceyes_graph.gate.keys import GateKeys
from speceyes_graph.gate.online import (
    DEFAULT_WINDOW,
    OnlineGate,
    RiskOptions,
    TrustOptions,
    read_evidence,
)
from speceyes_graph.gate.separability import GateConfig
from speceyes_graph.graph import create_speceyes_graph
from speceyes_graph.integrations.chat import create_speceyes_chat_graph
from speceyes_graph.settings import SERVED_CLIENT_SETTINGS, Limits, RunSettings
from speceyes_tools.blobs import blobs_from_url
from speceyes_tools.images import ImagePolicy, ImageStore

log = logging.getLogger(__name__)

env = os.environ.get


@functools.cache
def served_store() -> ImageStore:
    """The strict image store of the served graphs (shared by all of them). Its blobs are
    ``SPECEYES_BLOB_URL`` when set (``postgresql://...``, ``s3://bucket/prefix``, a folder:
    what every worker of a deployment reaches), else the folder ``SPECEYES_BLOB_DIR``."""
    dirs = [d for d in env("SPECEYES_IMAGE_DIRS", "").split(os.pathsep) if d]
    hosts = [h.strip() for h in env("SPECEYES_IMAGE_HOSTS", "").split(",") if h.strip()]
    bounds: dict[str, Any] = {"max_bytes": int(env("SPECEYES_BLOB_MAX_MB", "2048")) << 20}
    max_age_h = env("SPECEYES_BLOB_MAX_AGE_H")
    if max_age_h:
        bounds["max_age_s"] = float(max_age_h) * 3600
    url = env("SPECEYES_BLOB_URL") or env(
        "SPECEYES_BLOB_DIR", os.path.join(".langgraph_api", "speceyes-blobs")
    )
    return ImageStore(
        policy=ImagePolicy.strict(file_roots=dirs, allowed_hosts=hosts),
        blobs=blobs_from_url(url, **bounds),
    )


@functools.cache
def served_models() -> dict[str, Any]:
    """Keyword arguments for ``create_speceyes_graph``: models, prompts, gate, tools."""
    tools = env("SPECEYES_TOOLS", "deepeyes")
    thyme = tools == "thyme"  # the published Thyme settings: tau 0.95, 2048 tokens a step
    tau = float(env("SPECEYES_TAU", "0.95" if thyme else "0.98"))
    gate = GateConfig(tau=tau, k=int(env("SPECEYES_TOP_K", "64")))
    common: dict[str, Any] = {"gate": gate, "tools": tools}
    small_url, large_url = env("SPECEYES_SMALL_URL"), env("SPECEYES_LARGE_URL")
    if small_url and large_url:
        from speceyes_graph.models import openai_models

        models = openai_models(
            small_url,
            env("SPECEYES_SMALL_MODEL", "small"),
            large_url,
            env("SPECEYES_LARGE_MODEL", "large"),
            top_logprobs=gate.k,
            agent_max_tokens=2048 if thyme else 512,
            default_frame=env("SPECEYES_DEFAULT_FRAME", "") == "1",
        )
        if serves_the_demo(models):  # the shipped checkpoints behind servers: their prompts
            from speceyes_graph.demo import DEMO_GRAPH_SETTINGS
            from speceyes_graph.demo.engines import DEMO_TURN_TOKENS

            agent = models["agent"].model_copy(update={"max_tokens": DEMO_TURN_TOKENS})
            return {**DEMO_GRAPH_SETTINGS, **common, **models, "agent": agent}
        return {**common, **models}
    batch = int(env("SPECEYES_BATCH_SIZE", "16"))  # local models: requests per generate call
    small_path, large_path = env("SPECEYES_SMALL_PATH"), env("SPECEYES_LARGE_PATH")
    if small_path and large_path:
        from speceyes_graph.models import ChatTransformersVLM

        return {
            **common,
            "speculator": ChatTransformersVLM(
                model=small_path,
                top_logprobs=gate.k,
                max_tokens=20,  # the alias of max_new_tokens, the name its __init__ takes
                max_batch_size=batch,
            ),
            "agent": ChatTransformersVLM(model=large_path, max_batch_size=batch),
        }
    if env("SPECEYES_MODELS") == "example":
        return example_models()
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models

    models = demo_models(batch_size=batch)
    return {
        **DEMO_GRAPH_SETTINGS,
        **common,
        "speculator": models["small"],
        "agent": models["large"],
    }


def serves_the_demo(models: dict[str, Any]) -> bool:
    """Whether both servers report the demo checkpoints shipped here (as ``speceyes demo
    --engine vllm`` starts them): those were trained on their own prompts."""
    from pathlib import Path

    from speceyes_graph.demo import demo_checkpoints

    paths = demo_checkpoints()
    for role, key in (("small", "speculator"), ("large", "agent")):
        root = getattr(models[key], "served_root", None)
        if not root or Path(root).resolve() != paths[role].resolve():
            return False
    return True


def example_models() -> dict[str, Any]:
    from speceyes_graph.demo.example import make_example_models

    judge, speculator, agent = make_example_models()
    return {"judge": judge, "speculator": speculator, "agent": agent}


def client_settings() -> frozenset[str]:
    """What a client of the served graphs may set per run (context, configurable or an
    assistant's): ``SPECEYES_CLIENT_SETTINGS``, comma-separated names of
    :class:`~speceyes_graph.settings.RunSettings` (``all`` for every one), else
    :data:`~speceyes_graph.settings.SERVED_CLIENT_SETTINGS`. A run naming anything else fails
    with a SettingsError that says what it may set (docs/deployment.md, "What a client
    can change")."""
    named = env("SPECEYES_CLIENT_SETTINGS")
    if named is None:
        return SERVED_CLIENT_SETTINGS
    if named.strip() == "all":
        return frozenset(RunSettings.__dataclass_fields__)
    return frozenset(n.strip() for n in named.split(",") if n.strip())


def _served(factory, models: dict[str, Any], name: str):
    return factory(
        **models,
        store=served_store(),
        on_error=env("SPECEYES_ON_ERROR", "raise"),
        limits=Limits(client_settings=client_settings()),
    ).compile(name=name)


def make_graph():
    return _served(create_speceyes_graph, served_models(), "speceyes")


IMAGE_ROUTE = "/speceyes/images/{digest}?thread_id={thread_id}"
"""Where the served chat's thumbnails say the person's image is (``speceyes_graph.deploy.routes``)."""


def make_chat_graph():
    models = {**served_models(), "image_url": IMAGE_ROUTE}
    return _served(create_speceyes_chat_graph, models, "speceyes_chat")


@functools.cache  # once per process, however many graph ids load serve.py
def warn_if_the_online_gate_cannot_be_shared() -> None:
    """Said when a server loads the graphs (``serve.py``), not at the first run: without
    ``SPECEYES_GATE_KEY`` each worker's online gate learns alone."""
    if GateKeys.from_env() is None:
        log.warning(
            "speceyes_online: %s is not set, so the online gate cannot sign entries in the "
            "server's store: each worker keeps its own gate, learning from its own traffic "
            "alone (each answer's draft says gate_scope='process'); set %s to the same "
            "secret on every worker to share one (docs/deployment.md)",
            GATE_KEY_ENV, GATE_KEY_ENV,
        )  # fmt: skip


def online_gate(gate: GateConfig) -> OnlineGate:
    """The served online gate, from the environment: it scores drafts as the served gate
    does and starts guarded (accepting nothing, or from a gate file's evidence)."""
    shadow_rate, warmup, evidence = (
        env(name, "") for name in
        ("SPECEYES_SHADOW_RATE", "SPECEYES_GATE_WARMUP", "SPECEYES_GATE_EVIDENCE")
    )  # fmt: skip
    return OnlineGate(
        float(env("SPECEYES_MAX_RISK", "0.02")),
        float(shadow_rate) if shadow_rate else None,
        config=gate,
        tau=float(env("SPECEYES_GATE_START_TAU", "1.0")),
        evidence=read_evidence(evidence) if evidence else None,
        risk=RiskOptions(
            window=int(env("SPECEYES_GATE_WINDOW", str(DEFAULT_WINDOW))),
            warmup=int(warmup) if warmup else None,
        ),
        trust=TrustOptions(namespace="speceyes_online", max_share=_max_share()),
    )


def _max_share() -> float | None:
    """``SPECEYES_GATE_MAX_SHARE``: the most of the window one caller (on an open server, one
    minute of traffic) may hold; ``none`` for no cap (one trusted caller sends everything)."""
    named = env("SPECEYES_GATE_MAX_SHARE", "0.05").strip().lower()
    return None if named == "none" else float(named)


def make_online_graph():
    models = served_models()
    return _served(
        create_speceyes_graph,
        {**models, "gate": online_gate(models.get("gate") or GateConfig())},
        "speceyes_online",
    )


def make_agent_graph(models: dict[str, Any] | None = None, store: ImageStore | None = None):
    """LangChain's ``create_agent`` over the served large model and tools (native tool
    calls), with :class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware` in front: the
    judge, the draft and the gate as the plain graph has them."""
    from langchain.agents import create_agent

    from speceyes_graph.agents.loop import agent_system_prompt
    from speceyes_graph.agents.toolsets import build_tools, load_toolset
    from speceyes_graph.integrations.middleware import SpecEyesMiddleware, pixel_free_agent
    from speceyes_graph.prompts import Prompts
    from speceyes_tools.images import ResizeSpec

    models = served_models() if models is None else models
    store = served_store() if store is None else store
    large, prompts = models["agent"], models.get("prompts") or Prompts()
    resize = getattr(large, "resize_spec", None) or ResizeSpec()
    tools = build_tools(load_toolset(models.get("tools", "deepeyes")), resize=resize, store=store)
    speceyes = SpecEyesMiddleware(
        models["speculator"],
        judge=models.get("judge"),
        gate=models.get("gate"),
        prompts=prompts,
        store=store,
    )
    agent = create_agent(
        large,
        tools,
        system_prompt=agent_system_prompt("native", prompts, tools),
        middleware=[speceyes],
        name="speceyes_agent",
    )
    return pixel_free_agent(agent, store)


def make_example_graph():
    return _served(create_speceyes_graph, example_models(), "speceyes_example")


BUILDERS = {
    "speceyes": make_graph,
    "speceyes_chat": make_chat_graph,
    "speceyes_example": make_example_graph,
    "speceyes_online": make_online_graph,
    "speceyes_agent": make_agent_graph,
}
"""How each served graph is built, by graph id."""

_built: dict[str, Any] = {}
_building = threading.Lock()


def served_graph(graph_id: str) -> Any:
    """The served graph of ``graph_id``, built on first use and then the same object: a
    server imports the graphs' file at start, before it answers anything, so nothing heavy
    (the models) is built there (``serve.py`` names these as graph factories)."""
    graph = _built.get(graph_id)
    if graph is None:
        with _building:  # two first requests build it once
            graph = _built.get(graph_id)
            if graph is None:
                graph = _built[graph_id] = BUILDERS[graph_id]()
    return graph


async def aserved_graph(graph_id: str) -> Any:
    """:func:`served_graph` for a server's event loop: the first build (the models: seconds)
    runs in a worker thread, so the server keeps answering meanwhile."""
    graph = _built.get(graph_id)
    return graph if graph is not None else await asyncio.to_thread(served_graph, graph_id)
