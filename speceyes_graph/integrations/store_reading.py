"""A chat model that reads the image store: for middlewares placed *outside* SpecEyes.

Inside ``SpecEyesMiddleware`` (after it in ``create_agent``'s list) every middleware's
model call gets messages the way SpecEyes sends models: pixels as the model takes them. A
middleware placed before it (outside) sees the state's messages, whose images are
``blob://`` keys of the image store; a served model (``ChatOpenAI``) would send such a key
to its server as an ``image_url`` no server can fetch. Wrapping that middleware's own model
in :class:`StoreReadingChatModel` (``middleware.readable(model)``) gives it the same view as
a model inside: the keys become pixels at its frame, just before each call, and the state
keeps none. Calls, streams, ``bind_tools`` and ``with_structured_output`` go to the wrapped
model, its callbacks and tracing with them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, convert_to_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import ConfigDict

from speceyes_tools.deadlines import to_worker_thread
from speceyes_tools.images import ImageStore, store_scope

from ..messages import wire_messages

__all__ = ["StoreReadingChatModel"]


class StoreReadingChatModel(BaseChatModel):
    """``model``, sent the images of ``store`` that its messages name by key (see the module
    docstring). Build it with ``ImageStoreMiddleware.readable(model)``."""

    model: BaseChatModel
    store: ImageStore

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return f"store-reading-{self.model._llm_type}"

    def readable(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The messages as the wrapped model takes them."""
        return wire_messages(messages, self.model, self.store)

    def _readable_input(self, value: LanguageModelInput) -> list[BaseMessage]:
        if isinstance(value, PromptValue):
            return self.readable(value.to_messages())
        if isinstance(value, str):
            return self.readable(convert_to_messages([value]))
        return self.readable(convert_to_messages(value))

    # The wrapped model's run is the only one: its callbacks, tags and tracing are the
    # caller's, as if it were called directly (no run of this wrapper beside it).

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        with store_scope(self.store):
            reply = self.model.invoke(self._readable_input(input), config, stop=stop, **kwargs)
        return reply

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        messages = await to_worker_thread(self._readable_input, input)  # base64 encoding
        with store_scope(self.store):
            reply = await self.model.ainvoke(messages, config, stop=stop, **kwargs)
        return reply

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        with store_scope(self.store):
            messages = self._readable_input(input)
            yield from self.model.stream(messages, config, stop=stop, **kwargs)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        messages = await to_worker_thread(self._readable_input, input)
        with store_scope(self.store):
            async for chunk in self.model.astream(messages, config, stop=stop, **kwargs):
                yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """Only ``generate`` comes here (every other call is the wrapped model's own)."""
        reply = self.invoke(messages, stop=stop, **kwargs)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        """The wrapped model's binding, sent what it can read."""
        bound = self.model.bind_tools(tools, **kwargs)
        return RunnableLambda(self._readable_input, name="read_image_store") | bound

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Runnable[Any, Any]:
        """The wrapped model's structured output, sent what it can read (LangChain's
        ``LLMToolSelectorMiddleware`` calls its model this way)."""
        structured = self.model.with_structured_output(schema, **kwargs)
        return RunnableLambda(self._readable_input, name="read_image_store") | structured
