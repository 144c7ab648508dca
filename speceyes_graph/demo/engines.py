"""Where the demo's two models run: in this process (transformers) or behind vLLM servers.

The graph is the same either way; only the chat models change, with the same generation
settings (drafts of at most 8 tokens with the top 64 log-probs, agent turns of at most 256).
``engine="vllm"`` starts one vLLM server per demo checkpoint (``bash scripts/setup-vllm.sh``
first) and stops them afterwards, or uses servers already running (``small_url``,
``large_url``: ``http://host:port/v1``, optionally ``#served-name``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

__all__ = ["DEMO_DRAFT_TOKENS", "DEMO_TURN_TOKENS", "Engine", "EngineName", "demo_engine"]

EngineName = Literal["transformers", "vllm"]
DEMO_DRAFT_TOKENS = 8  # the demo's answers are one colour word
DEMO_TURN_TOKENS = 256  # a think, a tool call or an answer


@dataclass
class Engine:
    """The models of one demo run and a line saying where they ran."""

    name: EngineName
    description: str
    models: dict[str, Any]
    setup_s: float | None = None  # seconds the demo spent starting servers


def local_models(batch_size: int, paths: dict[str, Path]) -> dict[str, Any]:
    from ..models import ChatTransformersVLM

    return {
        "small": ChatTransformersVLM(
            model=str(paths["small"]),
            top_logprobs=64,
            max_tokens=DEMO_DRAFT_TOKENS,
            max_batch_size=batch_size,
        ),
        "large": ChatTransformersVLM(
            model=str(paths["large"]), max_tokens=DEMO_TURN_TOKENS, max_batch_size=batch_size
        ),
    }


def served_models(urls: dict[str, str], names: dict[str, str]) -> dict[str, Any]:
    from ..models import openai_chat_model

    return {
        "small": openai_chat_model(
            urls["small"], names["small"], top_logprobs=64, max_tokens=DEMO_DRAFT_TOKENS,
            timeout=300,
        ),
        "large": openai_chat_model(
            urls["large"], names["large"], max_tokens=DEMO_TURN_TOKENS, timeout=300
        ),
    }  # fmt: skip


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _server(url: str) -> tuple[str, str, str]:
    """(base URL, served name, engine description) of a running server; the name from
    ``URL#NAME``, else the server's only model."""
    base, _, name = url.partition("#")
    base = base.rstrip("/")
    entries = _get(f"{base}/models")["data"]
    if not name:
        if len(entries) != 1:
            raise ValueError(f"{base} serves {[e['id'] for e in entries]}: write {base}#NAME")
        name = entries[0]["id"]
    owner = next((e.get("owned_by") for e in entries if e.get("id") == name), None) or "server"
    version = None
    for route in ("version", "get_server_info"):  # vLLM's, SGLang's: beside the API
        try:
            version = _get(f"{base.removesuffix('/v1')}/{route}").get("version")
            break
        except (OSError, ValueError, AttributeError):
            continue
    label = {"vllm": "vLLM", "sglang": "SGLang"}.get(owner, owner)
    return base, name, f"{label} {version}" if version else label


@contextmanager
def demo_engine(
    engine: EngineName,
    paths: dict[str, Path],
    *,
    batch_size: int = 16,
    small_url: str | None = None,
    large_url: str | None = None,
    print_fn=print,
) -> Iterator[Engine]:
    """The demo's models on ``engine``; servers this starts are stopped on exit."""
    if engine == "transformers":
        import transformers

        yield Engine(
            "transformers",
            f"transformers {transformers.__version__}, in this process",
            local_models(batch_size, paths),
        )
        return
    if engine != "vllm":
        raise ValueError(f"unknown engine {engine!r}; use 'transformers' or 'vllm'")
    from ..models.servers import EngineServer, VLLMServer, start_servers

    servers: list[EngineServer] = []
    setup_s = None
    try:
        if small_url or large_url:
            if not (small_url and large_url):
                raise ValueError("give both small_url and large_url, or neither")
            urls = {"small": small_url, "large": large_url}
        else:
            print_fn("starting two vLLM servers for the demo checkpoints (about a minute)")
            t0 = time.perf_counter()
            servers = start_servers(
                [VLLMServer(paths[role], name=role) for role in ("small", "large")]
            )
            setup_s = time.perf_counter() - t0
            urls = {cast(str, s.name): s.url for s in servers}  # each named by its role above
        found = {role: _server(url) for role, url in urls.items()}
        labels = sorted({label for _, _, label in found.values()})
        where = ", ".join(f"{role} at {base}" for role, (base, _, _) in found.items())
        started = f", started by the demo in {setup_s:.0f} s" if setup_s else ""
        yield Engine(
            "vllm",
            f"{' and '.join(labels)} (OpenAI-compatible servers: {where}{started})",
            served_models({r: f[0] for r, f in found.items()}, {r: f[1] for r, f in found.items()}),
            setup_s,
        )
    finally:
        for server in servers:
            server.stop()
