"""Scripted chat models: deterministic stand-ins for tests and the offline example.

:class:`ScriptedChatModel` is a real ``BaseChatModel`` whose reply is computed by a Python
function of the messages, so graphs run end to end (batching, streaming, tool calls)
without weights. :func:`fake_logprobs` writes OpenAI-format top-K log-probs with a chosen
separability per token, for exercising the gate.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

__all__ = ["ScriptedChatModel", "fake_logprobs"]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose reply is ``respond(messages)`` (a string or an ``AIMessage``).

    ``delay_s``: each call takes that long, like a served model's round trip (``ainvoke``
    waits with ``asyncio.sleep``, holding no thread, as an HTTP client would)."""

    respond: Callable[[list[BaseMessage]], Any]
    delay_s: float = 0.0
    calls: int = 0
    bound_tools: list[Any] = []
    call_kwargs: list[dict[str, Any]] = []  # generation kwargs of each call, e.g. max_tokens
    received: list[list[BaseMessage]] = []  # the messages of each call, as the model got them
    # keep call_kwargs and received (tests read them); a benchmark of thousands of calls turns
    # it off, or the kept messages become the garbage collector's work, not the graph's
    record: bool = True
    # sent a ChatMessage(role="user") as ChatOpenAI sends it (messages.takes_chat_role)
    takes_chat_role: ClassVar[bool] = True

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self._reply(messages, stop, kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self._reply(messages, stop, kwargs)

    def _reply(self, messages: list[BaseMessage], stop: Any, kwargs: dict[str, Any]) -> ChatResult:
        self.calls += 1
        if self.record:
            self.call_kwargs.append({"stop": stop, **kwargs})
            self.received.append(list(messages))
        out = self.respond(messages)
        message = out if isinstance(out, AIMessage) else AIMessage(content=str(out))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        self.bound_tools = list(tools)
        return self


def fake_logprobs(
    tokens: Sequence[str], separability: Sequence[float], k: int = 64, seed: int = 0
) -> dict[str, Any]:
    """OpenAI ``logprobs`` with per-token separability exactly ``separability[i]`` at top-``k``.

    Competitors are deterministic pseudo-random logits; the top-1 is placed so that
    ``(l1 - mean) / (std + 1e-6)`` equals the requested value, then each row is shifted to
    log-probabilities (which does not change the score).
    """
    rng = np.random.default_rng(seed)
    content = []
    for token, s in zip(tokens, separability, strict=True):
        competitors = rng.normal(0.0, 1.0, size=k - 1)
        competitors = np.sort(competitors)[::-1]
        top1 = competitors.mean() + s * (competitors.std() + 1e-6)
        if top1 < competitors[0]:
            raise ValueError(f"separability {s} is too low for a top-1 token at k={k}")
        logits = np.concatenate([[top1], competitors])
        logprobs = logits - (logits.max() + math.log(np.exp(logits - logits.max()).sum()))
        top = [
            {"token": token if i == 0 else f"<alt{i}>", "logprob": float(v)}
            for i, v in enumerate(logprobs)
        ]
        content.append({"token": token, "logprob": top[0]["logprob"], "top_logprobs": top})
    return {"content": content}
