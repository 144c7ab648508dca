"""SpecEyes over OpenAI-compatible servers (vLLM, SGLang): configuration, not code.

The graph is the same; the models become ``ChatOpenAI`` clients. The speculator asks for
``logprobs=True, top_logprobs=K`` (start vLLM with ``--max-logprobs K`` or more: its
default cap is 20, and a server returning fewer than K is detected by the gate, which
rejects the draft with an error naming the flag instead of scoring with fewer
competitors). Images go out as base64 data URLs already resized to what the model uses,
and zoomed crops come back as user turns (servers reject images in tool messages).

Concurrency is bounded by ``graph.batch(..., {"max_concurrency": N})``: each query is one
in-flight request at a time, and the server's continuous batching does the rest. The
OpenAI client retries connection errors, 408/409/429 and 5xx with exponential backoff
(``max_retries``) and gives up after ``timeout`` seconds per request; a request that still
fails fails only its query, recorded in ``error``.
"""

from __future__ import annotations

from typing import Any

from speceyes_tools.images import ResizeSpec

from .families import family_resize

__all__ = ["openai_chat_model", "openai_models"]


def openai_chat_model(
    base_url: str,
    model: str,
    *,
    top_logprobs: int | None = None,
    max_tokens: int | None = None,
    timeout: float = 120.0,
    max_retries: int = 3,
    api_key: str = "EMPTY",
    **kwargs: Any,
):
    """A greedy ``ChatOpenAI`` client for one served model (``top_logprobs`` for speculators)."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "serving needs langchain-openai: pip install 'speceyes-graph[openai]'"
        ) from exc
    if top_logprobs:
        kwargs.update(logprobs=True, top_logprobs=top_logprobs)
    return ChatOpenAI(
        base_url=base_url,
        model=model,
        api_key=api_key,
        temperature=0,
        max_tokens=max_tokens,
        timeout=timeout,
        max_retries=max_retries,
        **kwargs,
    )


def openai_models(
    small_url: str,
    small_model: str,
    large_url: str,
    large_model: str,
    *,
    top_logprobs: int = 64,
    timeout: float = 120.0,
    max_retries: int = 3,
    agent_max_tokens: int | None = 512,
    resize: ResizeSpec | None = None,
    speculator_resize: ResizeSpec | None = None,
) -> dict[str, Any]:
    """``{"speculator", "agent", "resize", "speculator_resize"}`` for
    ``create_speceyes_graph(**openai_models(...))``.

    The agent also judges (phase I), as in the paper; the graph asks the judge for 10
    tokens and the speculator for 20 per call. Images are sent within each model family's
    own limits (:mod:`.families`: Qwen2.5-VL / DeepEyes up to 12,845,056 pixels), not
    shrunk to a megapixel; pass ``resize`` / ``speculator_resize`` to override.
    """
    return {
        "resize": resize or family_resize(large_model),
        "speculator_resize": speculator_resize or family_resize(small_model),
        "speculator": openai_chat_model(
            small_url,
            small_model,
            top_logprobs=top_logprobs,
            timeout=timeout,
            max_retries=max_retries,
        ),
        "agent": openai_chat_model(
            large_url,
            large_model,
            max_tokens=agent_max_tokens,
            timeout=timeout,
            max_retries=max_retries,
        ),
    }
