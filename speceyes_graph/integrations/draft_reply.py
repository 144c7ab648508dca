"""An accepted draft, handed to the agent's callbacks the way its model's replies are.

An agent's reply reaches ``stream_mode="messages"``, ``astream_events`` and tracers as a
chat model's run whose tokens arrive one by one. An accepted draft is the agent's reply too,
but it was generated (by the small model, tagged ``nostream``: the judge's and the draft's
own calls are internal) and gated before it was known to be the reply: the gate needs every
token's log-probs. :func:`replay` then runs it through a chat model of its own
(:class:`DraftReply`, run name ``speceyes_reply``) that yields the draft's tokens, so a
client streaming the agent sees the accepted reply as token chunks with the same message id
as the reply in the state, like any reply of the agent. The tokens arrive at once: the
draft is already whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

__all__ = ["DraftReply", "areplay", "replay"]

RUN_NAME = "speceyes_reply"


class DraftReply(BaseChatModel):
    """A chat model whose one reply is ``message``, streamed as ``tokens``."""

    message: AIMessage
    tokens: list[str]

    @property
    def _llm_type(self) -> str:
        return "speceyes-draft-reply"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        last = len(self.tokens) - 1
        for i, token in enumerate(self.tokens):
            chunk = ChatGenerationChunk(
                message=AIMessageChunk(
                    content=token,
                    id=self.message.id,
                    response_metadata=self.message.response_metadata if i == last else {},
                    chunk_position="last" if i == last else None,
                )
            )
            if run_manager is not None:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk


def _model(message: AIMessage, tokens: Sequence[str] | None) -> DraftReply:
    text = message.content if isinstance(message.content, str) else ""
    pieces = [str(t) for t in tokens or []]
    if not pieces or "".join(pieces) != text:  # tokens that do not spell the reply: whole
        pieces = [text]
    return DraftReply(message=message, tokens=pieces)


def replay(message: AIMessage, tokens: Sequence[str] | None, asked: Sequence[BaseMessage]) -> None:
    """Run the reply through the callbacks of the current run (a model node's)."""
    _model(message, tokens).invoke(list(asked), {"run_name": RUN_NAME})


async def areplay(
    message: AIMessage, tokens: Sequence[str] | None, asked: Sequence[BaseMessage]
) -> None:
    await _model(message, tokens).ainvoke(list(asked), {"run_name": RUN_NAME})
