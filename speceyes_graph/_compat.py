"""Every place speceyes-graph relies on a dependency's internals, and why.

Nothing else in the package imports a dependency's private module or changes a dependency's
objects (``tests/test_layout.py`` checks the imports). Each entry here is one that no public
API covers yet; it says which public way was tried, and what upstream change would remove
it. ``tests/test_compat.py`` has a test for each that fails when the dependency changes what
the entry relies on; CI runs it at the newest releases and at the declared floors
(``scripts/floors.sh``).
"""

from __future__ import annotations

import functools
from typing import Any

from langchain_core.callbacks import BaseCallbackManager

# The config key under which a graph run inside a node finds its caller's stream, and
# LangGraph's handler of stream_mode="messages" (see without_values_stream and
# without_messages_stream)
from langgraph._internal._constants import CONFIG_KEY_STREAM

# LangGraph's own node runnable: a sync and an async function in one node, ``config`` and
# ``runtime`` injected as for a function node, and no traced run of its own (LangGraph's node
# run is the trace). The public ``RunnableLambda(func, afunc)`` takes both functions but
# traces a second run inside every node and injects no ``runtime``. Upstream, LangGraph plans
# to take plain callables and an async-invocable protocol in ``add_node``
# (langchain-ai/langgraph#5092); a node given both would remove this import.
from langgraph._internal._runnable import RunnableCallable
from langgraph.channels import EphemeralValue
from langgraph.constants import START
from langgraph.pregel._messages import StreamMessagesHandler
from langgraph.pregel.protocol import StreamProtocol

__all__ = [
    "NO_VALUE",
    "PUSHED_MESSAGES_KEEP_THE_GRAPH",
    "RunnableCallable",
    "StreamsWhenAsked",
    "cache_content_block_types",
    "set_input_channel",
    "without_messages_stream",
    "without_values_stream",
]


def without_messages_stream(callbacks: Any) -> Any:
    """``callbacks`` (a manager or a list) without LangGraph's ``stream_mode="messages"``
    handler, for a graph run inside a node whose inner messages must not reach the caller's
    messages stream, while tracing and the other stream modes still see the inner run.

    Public ways fall short: the ``nostream`` tag (``langgraph.constants.TAG_NOSTREAM``)
    silences chat-model tokens only, not the messages the inner nodes write, and the hidden
    tag hides the run from tracing too. A ``nostream`` tag that covered node outputs would
    remove this (no upstream issue found)."""
    if isinstance(callbacks, BaseCallbackManager):
        kept = callbacks.copy()
        for handler in list(kept.handlers) + list(kept.inheritable_handlers):
            if isinstance(handler, StreamMessagesHandler):
                kept.remove_handler(handler)
        return kept
    if isinstance(callbacks, list):
        return [h for h in callbacks if not isinstance(h, StreamMessagesHandler)]
    return callbacks


def without_values_stream(config: Any) -> Any:
    """``config`` for a graph run inside a node whose state must not reach the caller's
    ``values`` stream (with subgraphs), while ``updates``, ``custom`` and the rest still do.

    A chat UI on LangGraph's ``useStream`` (agent-chat-ui streams with subgraphs) takes every
    namespaced ``values`` event for the thread's state, unless the namespace starts with
    ``tools:``: the chat's inner SpecEyes state, which has no ``messages``, blanked the
    conversation on screen until the run ended. No public setting keeps one nested run out of
    one stream mode; the nested run finds the caller's stream under ``CONFIG_KEY_STREAM`` and
    sends it the modes it lists, so a copy that lists all but ``values`` does it. A per-call
    choice of the modes a subgraph streams upward, or ``useStream`` keeping to the root's
    values, would remove this (no upstream issue found)."""
    configurable = config.get("configurable") or {}
    stream = configurable.get(CONFIG_KEY_STREAM)
    if stream is None or "values" not in stream.modes:
        return config
    kept = StreamProtocol(stream.__call__, stream.modes - {"values"})
    return {**config, "configurable": {**configurable, CONFIG_KEY_STREAM: kept}}


def _langgraph_at_least(*wanted: int) -> bool:
    from importlib.metadata import version

    release = version("langgraph").split("+")[0].split(".")[:3]
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in release) >= wanted


PUSHED_MESSAGES_KEEP_THE_GRAPH = _langgraph_at_least(1, 2, 19)
"""Whether LangGraph's public ``push_message`` streams a node's message in the node's own
graph. From langgraph 1.2.19 it does; before, it labelled the message with the node's task
as if a subgraph had sent it, so a root node's message reached only ``subgraphs=True``
streams, under a namespace chat UIs do not show. The chat front pushes the agent's steps as
they happen only where it does, and otherwise lets them come with the turn's answer
(``tests/test_compat.py`` checks the flag against the behaviour). Raising the langgraph floor
to 1.2.19 (which needs langchain-core 1.4.7) would remove this."""


NO_VALUE: Any = EphemeralValue(object).value
"""LangGraph's marker for a channel with no value, as a fresh channel holds it (what
``from_checkpoint`` receives for a channel the checkpoint lacks). LangGraph keeps it in a
private module; a fresh channel's value is the one way to reach it."""


def set_input_channel(compiled: Any, channel: Any) -> None:
    """Make ``channel`` a compiled graph's record of each run's input (its ``__start__``
    channel), so a value is changed as LangGraph takes the input, before any checkpoint or
    saved write holds it (pasted images become image-store keys).

    No public hook sees the input first: ``input_schema`` channels and reducers apply after
    ``__start__`` is checkpointed, and a checkpointer's serializer would see pixels in every
    write it encodes. A public input hook on ``StateGraph.compile`` would remove this (no
    upstream issue found)."""
    if START not in compiled.channels:
        raise TypeError(f"{type(compiled).__name__} has no {START} channel to replace")
    compiled.channels[START] = channel


class StreamsWhenAsked:
    """A chat model that streams only when asked (``stream()``/``astream()``, or
    ``streaming=True``), mixed in before :class:`~langchain_core.language_models.BaseChatModel`.

    langchain-core streams an ``invoke`` whenever a callback handler could take tokens, which
    LangGraph's ``stream_mode="messages"`` always adds: every call inside a streamed graph
    would become an unbatched generation. The public ``disable_streaming`` turns explicit
    ``stream()`` off too. langchain-core asks two private methods; a public "stream only when
    asked" setting would remove these overrides. ``_should_use_protocol_streaming`` is absent
    in older langchain-core releases, where it is simply never called."""

    def _streaming_asked(self, kwargs: dict[str, Any]) -> bool:
        return bool(kwargs.get("stream") or getattr(self, "streaming", False))

    def _should_stream(self, *, async_api: bool, run_manager: Any = None, **kwargs: Any) -> bool:
        return self._streaming_asked(kwargs) and bool(
            super()._should_stream(  # type: ignore[misc]
                async_api=async_api, run_manager=run_manager, **kwargs
            )
        )

    def _should_use_protocol_streaming(
        self, *, async_api: bool, run_manager: Any = None, **kwargs: Any
    ) -> bool:
        return self._streaming_asked(kwargs) and bool(
            super()._should_use_protocol_streaming(  # type: ignore[misc]
                async_api=async_api, run_manager=run_manager, **kwargs
            )
        )


def cache_content_block_types() -> None:
    """Every chat-model call formats its messages for tracing, and langchain-core asks, for
    each image block, ``typing.get_type_hints`` of its data-block types anew (a real share
    of the graph's host time when models answer at once: docs/throughput.md, measured by
    ``scripts/bench_internals.py``). The types are fixed when langchain-core is imported, so
    the answer is computed once: the one change this package makes to a dependency's
    objects, applied on import. A langchain-core that caches it itself (as ``langchain`` did
    for its own type resolution, langchain-ai/langchain#36649), or names it otherwise, is
    left alone."""
    from langchain_core.messages import content

    compute = getattr(content, "_get_data_content_block_types", None)
    if callable(compute) and not hasattr(compute, "cache_info"):
        content._get_data_content_block_types = functools.cache(compute)
