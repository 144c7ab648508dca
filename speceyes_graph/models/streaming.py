"""Token-by-token replies: one request generated in a thread of its own, its tokens turned
into text chunks as they come.

A stream never goes through the batch worker (it would hold up every batch behind it), so
:func:`stream_reply` runs :meth:`BatchedGeneration.run_batch` on the one request with a
:class:`TokenStreamer` and yields what can be shown: text is held back while a stop string
may be forming or a character is incomplete, nothing after a stop string is shown, and the
last chunk carries the reply's metadata and tool calls, so the joined chunks equal
``invoke``'s reply.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from speceyes_tools.deadlines import DeadlineExceeded

from .generation import BatchedGeneration, GenerationKey

__all__ = ["TokenStreamer", "stream_reply"]

log = logging.getLogger(__name__)


class TokenStreamer:
    """The smallest ``transformers`` streamer: generated token ids into a queue (the first
    ``put`` is the prompt, which is skipped)."""

    def __init__(self, tokens: queue.SimpleQueue):
        self.tokens = tokens
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.tokens.put([int(t) for t in value.reshape(-1).tolist()])

    def end(self) -> None:
        pass


def stream_reply(
    generation: BatchedGeneration, key: GenerationKey, prepared: dict, time_left_s: float | None
) -> Iterator[ChatGenerationChunk]:
    """The reply to one prepared request, chunk by chunk, within ``time_left_s`` seconds."""
    stops: tuple = key[2]
    tokens: queue.SimpleQueue = queue.SimpleQueue()
    result: dict[str, Any] = {}
    streamer = TokenStreamer(tokens)

    def generate() -> None:
        try:
            result["message"] = generation.run_batch(key, [prepared], streamer)[0]
        except BaseException as exc:  # handed to the consumer below
            result["error"] = exc
        finally:
            tokens.put(None)

    ends_at = None if time_left_s is None else time.monotonic() + time_left_s
    threading.Thread(target=generate, name="speceyes-stream", daemon=True).start()
    tokenizer = generation.processor.tokenizer
    hold = max((len(s) for s in stops), default=1) - 1  # a stop string may be forming
    ids: list[int] = []
    stopped = False
    sent = prepared["prefix"]
    if sent:  # the forced start of the reply (tool_choice) comes first
        yield ChatGenerationChunk(message=AIMessageChunk(content=sent))
    while True:
        try:
            wait = None if ends_at is None else max(0.0, ends_at - time.monotonic())
            token = tokens.get(timeout=wait)
        except queue.Empty:
            raise DeadlineExceeded("the deadline passed while streaming") from None
        if token is None:
            break
        ids.extend(token)
        if stopped:
            continue  # past a stop string: drain the rest, show nothing more
        text = prepared["prefix"] + tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete character: wait for the rest
            continue
        cuts = [i for i in (text.find(s, len(prepared["prefix"])) for s in stops) if i >= 0]
        stopped = bool(cuts)
        text = text[: min(cuts)] if cuts else text
        ready = text if stopped else text[: max(len(sent), len(text) - hold)]
        if len(ready) > len(sent) and ready.startswith(sent):
            yield ChatGenerationChunk(message=AIMessageChunk(content=ready[len(sent) :]))
            sent = ready
    if "error" in result:
        raise result["error"]
    final: AIMessage = result["message"]
    text = final.content if isinstance(final.content, str) else ""
    if not text.startswith(sent):  # cannot happen with one token per step; never silent
        log.warning("streamed text %r is not a prefix of the final reply %r", sent, text)
    rest = text[len(sent) :] if text.startswith(sent) else ""
    yield ChatGenerationChunk(
        message=AIMessageChunk(
            content=rest,
            response_metadata=final.response_metadata,
            usage_metadata=final.usage_metadata,
            # "type" is NotRequired, imported from typing by langchain-core (3.11+): mypy's 3.10
            # target does not see that, and takes it for a required key
            tool_call_chunks=[
                {  # type: ignore[typeddict-item]
                    "name": c["name"],
                    "args": json.dumps(c["args"]),
                    "id": c["id"],
                    "index": i,
                }
                for i, c in enumerate(final.tool_calls)
            ],
            chunk_position="last",
        )
    )
