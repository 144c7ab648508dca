"""SpecEyes over OpenAI-compatible servers (vLLM, SGLang): configuration, not code.

The graph is the same; the models become ``ChatOpenAI`` clients. The speculator asks for
``logprobs=True, top_logprobs=K`` (start vLLM with ``--max-logprobs K`` or more: its
default cap is 20: a server returning fewer than K is reported when the client is built,
and still caught per draft by the gate, which rejects the draft with an error naming the flag
instead of scoring with fewer competitors). Each client asks its server which checkpoint it
serves (:mod:`.served`), for the image frame and the context length. Images go out as base64 data URLs already resized to what the model uses,
and zoomed crops come back as user turns (servers reject images in tool messages).

Concurrency is bounded by ``graph.batch(..., {"max_concurrency": N})``: each query is one
in-flight request at a time, and the server's continuous batching does the rest. The
OpenAI client retries connection errors, 408/409/429 and 5xx with exponential backoff
(``max_retries``) and gives up after ``timeout`` seconds per request; a request that still
fails fails only its query, recorded in ``error``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from speceyes_tools.images import ResizeSpec

from .served import check_top_logprobs, describe_served_model, served_boxes, served_resize

if TYPE_CHECKING:
    from .served_chat import ServedChatModel

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
    resize: ResizeSpec | None = None,
    context_length: int | None = None,
    probe: bool = True,
    default_frame: bool = False,
    **kwargs: Any,
) -> ServedChatModel:
    """A greedy ``ChatOpenAI`` client for one served model (``top_logprobs`` for speculators).

    With ``probe`` (the default) the server is asked what it serves (:mod:`.served`): the
    image frame and context length come from the checkpoint it loaded, and a speculator's
    server that returns fewer than ``top_logprobs`` log-probs raises
    :class:`~speceyes_graph.models.served.ServedModelError` here, naming the flag to set,
    whatever the server's listing says. ``resize`` and ``context_length`` override what the
    server says. A server that answers but does not say which checkpoint it serves, for a
    name of no known family, is refused (the images' frame is unknown) unless ``resize`` or
    ``default_frame=True`` (images at most 1 MP: hosted APIs that resize them) says it.
    """
    try:
        from .served_chat import ServedChatModel
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "serving needs langchain-openai: pip install 'speceyes-graph[openai]'"
        ) from exc
    info = describe_served_model(base_url, model, api_key=api_key) if probe else None
    if resize is None:
        resize = served_resize(model, info, default_frame=default_frame, url=base_url)
    if info is not None and top_logprobs:  # whatever its listing said (None: not reached)
        check_top_logprobs(base_url, model, top_logprobs, api_key=api_key)
    if top_logprobs:
        kwargs.update(logprobs=True, top_logprobs=top_logprobs)
    kwargs.setdefault("stream_usage", True)  # vLLM and SGLang report usage when streaming too
    return ServedChatModel(
        base_url=base_url,
        model=model,
        api_key=SecretStr(api_key),  # what pydantic makes of the str
        temperature=0,
        max_completion_tokens=max_tokens,  # ChatOpenAI's alias of max_tokens
        timeout=timeout,
        max_retries=max_retries,
        resize_spec=resize,
        context_length=context_length or (info.max_model_len if info else None),
        served_root=info.root if info else None,
        box_coordinates=served_boxes(model, info),
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
    speculator_max_tokens: int | None = None,
    resize: ResizeSpec | None = None,
    speculator_resize: ResizeSpec | None = None,
    probe: bool = True,
    default_frame: bool = False,
) -> dict[str, Any]:
    """``{"speculator", "agent", "resize"}`` for ``create_speceyes_graph(**openai_models(...))``
    (the speculator's frame is its ``resize_spec``, which the graph reads).

    The agent also judges (phase I), as in the paper; the graph asks the judge for 10
    tokens and the speculator for 20 per call. Images are sent in the frame of each server's
    own checkpoint, asked of the server (``probe``), else within the model family's limits
    (:mod:`.families`: Qwen2.5-VL / DeepEyes up to 12,845,056 pixels), not shrunk to a
    megapixel; ``resize`` / ``speculator_resize`` override both, and ``default_frame`` accepts
    the 1 MP default where neither the server nor the name says the frame.
    """
    common: dict[str, Any] = {
        "timeout": timeout,
        "max_retries": max_retries,
        "probe": probe,
        "default_frame": default_frame,
    }
    speculator = openai_chat_model(
        small_url,
        small_model,
        top_logprobs=top_logprobs,
        max_tokens=speculator_max_tokens,
        resize=speculator_resize,
        **common,
    )
    agent = openai_chat_model(
        large_url, large_model, max_tokens=agent_max_tokens, resize=resize, **common
    )
    return {
        "resize": agent.resize_spec,
        "speculator": speculator,
        "agent": agent,
    }
