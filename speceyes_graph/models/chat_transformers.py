"""Local Hugging Face vision-language models as LangChain chat models, batched across queries.

:class:`ChatTransformersVLM` loads any image-text-to-text checkpoint with a chat template
(Qwen2.5-VL fine-tunes such as DeepEyes or Thyme, Qwen3-VL, SmolVLM, Gemma 3, InternVL,
Mistral 3, ...: docs/models.md) through ``AutoProcessor`` / ``AutoModelForImageTextToText``
and renders LangChain messages with the checkpoint's own chat template. Decoding is greedy by default. With ``top_logprobs=K`` every reply carries
the top-K log-probs of each generated token in ``response_metadata["logprobs"]`` in the
OpenAI format, so the SpecEyes gate treats local and served models the same way; every
reply carries ``usage_metadata``.

Every call goes through LangChain's own run handling (callbacks, tracing, message ids,
``output_version``): ``invoke``, ``batch``, ``ainvoke``, ``abatch`` and calls from inside a
graph reach :meth:`_generate`, which hands the prepared request to a
:class:`~speceyes_graph.models.batching.BatchScheduler`; concurrent requests with the same
generation settings are coalesced into one left-padded ``generate`` call. ``stream`` and
``astream`` yield ``AIMessageChunk`` s token by token from a generation of their own, in a
thread of their own, so a stream never holds up the batch worker.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
import warnings
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, ClassVar, Literal, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import get_config_list
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, model_validator
from tenacity import AsyncRetrying, Retrying, retry_if_not_exception_type, stop_after_attempt

from speceyes_tools.deadlines import (
    DeadlineExceeded,
    cpu_work,
    deadline_scope,
    time_left,
    to_worker_thread,
)
from speceyes_tools.geometry import Coordinates
from speceyes_tools.images import ResizeSpec
from speceyes_tools.memory import ImageMemory

from .._compat import StreamsWhenAsked  # only an explicit stream() streams
from .batching import BatchScheduler
from .conversion import (
    SystemTurn,
    convert_messages,
    fold_system,
    refuses_system_turn,
    special_token_escaper,
)
from .families import box_convention, processor_resize
from .generation import BatchedGeneration, GenerationKey, can_join
from .hub import hub_problem, looks_like_hub_id
from .image_cache import CachedImageProcessor, CachedVisionEncoder, image_keys
from .memory import TokenBudget, default_batch_tokens
from .streaming import stream_reply

# The image store hands out read-only arrays (shared between threads: nobody may write into
# them); transformers' torchvision image backend wraps them with torch.from_numpy and only
# reads them, and torch warns on every such wrap. Silenced for that call site and message
# only, not globally.
warnings.filterwarnings(
    "ignore",
    message="The given NumPy array is not writable",
    category=UserWarning,
    module=r"transformers\.image_processing",
)

__all__ = ["ChatTransformersVLM"]

log = logging.getLogger(__name__)

_PRELOADED = threading.local()  # hands a built model to __init__ (see from_components)


class _Prepaid:
    """Announcements :meth:`ChatTransformersVLM.batch` made for the calls its first wave of
    threads will make: each of those calls takes one instead of announcing itself. Calls
    beyond the wave announce themselves when their thread starts, so a wave never waits for
    calls that cannot start until it is done."""

    def __init__(self, model: Any, count: int):
        self.model, self.left, self._lock = model, count, threading.Lock()

    def take(self, model: Any) -> bool:
        with self._lock:
            if model is not self.model or self.left <= 0:
                return False
            self.left -= 1
            return True


# set by batch() around LangChain's batch; its threads run in a copy of the caller's context
_PREPAID: contextvars.ContextVar[_Prepaid | None] = contextvars.ContextVar(
    "speceyes_prepaid", default=None
)
_FORCING = ("any", "required", True)


class ChatTransformersVLM(StreamsWhenAsked, BaseChatModel):
    """A local image-text-to-text checkpoint as a batched LangChain chat model.

    Example::

        small = ChatTransformersVLM(model="Qwen/Qwen3-VL-2B-Instruct", top_logprobs=64, max_tokens=20)
        large = ChatTransformersVLM(model="ChenShawn/DeepEyes-7B", max_tokens=512)

    ``max_tokens`` is the standard name of ``max_new_tokens``; both are accepted, at
    construction and per call. ``stream()`` streams token by token; inside a LangGraph run
    streamed with ``stream_mode="messages"`` calls stay batched (the whole reply arrives at
    once) unless ``streaming=True``, which trades batching for token streaming.
    """

    model: str = Field(description="Local path or hub id of the checkpoint.")
    top_logprobs: int | None = Field(
        default=None, description="Return the top-K log-probs of each token."
    )
    max_new_tokens: int = Field(default=512, alias="max_tokens", ge=1)
    temperature: float = 0.0
    stop: list[str] | None = None
    timeout: float | None = Field(
        default=None, description="Deadline of one call, in seconds (None: the caller's)."
    )
    max_retries: int = Field(
        default=0, ge=0, description="Extra attempts for a request whose generation failed."
    )
    streaming: bool = Field(
        default=False, description="invoke() streams token by token (unbatched) when True."
    )
    dtype: str = "auto"
    device_map: str | None = None
    attn_implementation: str | None = None
    max_batch_size: int = 16
    max_batch_tokens: int | Literal["auto"] | None = Field(
        default="auto",
        description="The most padded tokens one batch may hold (rows x (longest prompt + "
        "longest max_tokens)); a request over it runs alone. 'auto': half the GPU memory free "
        "when the first batch forms over an estimate of one token's cost, or 65,536 on a CPU; "
        "None: batches are bounded by count only. Lowered when a batch runs out of memory.",
    )
    max_wait_ms: float = 5.0
    parse_tool_calls: bool = True
    join_batches: bool = Field(
        default=True,
        description="Waiting greedy requests with other stop strings, or no more new tokens, "
        "ride along a batch being launched instead of waiting for it and running their own.",
    )
    vision_cache_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description="Vision-tower outputs kept for reuse, per image (exact; on the model's "
        "device); 0: none.",
    )
    image_cache_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Processed images kept for reuse (judge, then each agent turn), in host "
        "memory; None: under the process's image memory, one bound with decoded images "
        "(speceyes_tools.memory: 2 GiB, or SPECEYES_IMAGE_MEMORY_BYTES); a number: a bound "
        "of their own; 0: none.",
    )
    system_turn: SystemTurn = Field(
        default="auto",
        description="How a system message reaches the chat template: 'keep' (a system turn), "
        "'fold' (its text starts the next user turn), 'auto' (folded where the template "
        "refuses a system turn beside an image, or drops its text: Llama 3.2 Vision).",
    )
    processor_kwargs: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    handles_deadlines: ClassVar[bool] = True  # waits are bounded by the caller's deadline
    accepts_image_refs: ClassVar[bool] = True  # blob:// references: pixels from the store
    takes_chat_role: ClassVar[bool] = True  # a ChatMessage(role="user") is a user turn
    # continues a conversation that ends in an assistant message; a call with
    # continue_final_message=False starts a new assistant turn instead
    continues_final_message: ClassVar[bool] = True

    _hf_model: Any = PrivateAttr(default=None)
    _processor: Any = PrivateAttr(default=None)
    _scheduler: BatchScheduler | None = PrivateAttr(default=None)
    _escape: Any = PrivateAttr(default=None)
    _generation: BatchedGeneration | None = PrivateAttr(default=None)
    _fold_system: bool = PrivateAttr(default=False)
    # preparation shares the process-wide CPU gate with image work, earliest deadline first
    _preparing: Any = PrivateAttr(default_factory=cpu_work)

    @model_validator(mode="before")
    @classmethod
    def _warn_unknown(cls, values: Any) -> Any:
        if isinstance(values, dict):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            unknown = sorted(set(values) - known)
            if unknown:
                log.warning("ChatTransformersVLM ignores unknown parameters %s", unknown)
        return values

    @classmethod
    def from_components(cls, hf_model: Any, processor: Any, **kwargs: Any) -> ChatTransformersVLM:
        """Wrap an already-built model and processor (e.g. random full-size weights on a GPU)."""
        _PRELOADED.value = (hf_model, processor)
        try:
            return cls(model=kwargs.pop("model", type(hf_model).__name__), **kwargs)
        finally:
            _PRELOADED.value = None

    def model_post_init(self, context: Any) -> None:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        preloaded = getattr(_PRELOADED, "value", None)
        if preloaded is not None:
            self._hf_model, self._processor = preloaded
        else:
            if looks_like_hub_id(self.model) and (problem := hub_problem(self.model)):
                raise OSError(problem)  # what from_pretrained raises, minutes sooner
            # transformers leaves AutoProcessor.from_pretrained unannotated
            self._processor = AutoProcessor.from_pretrained(  # type: ignore[no-untyped-call]
                self.model, **self.processor_kwargs
            )
            has_cuda = torch.cuda.is_available()
            kwargs: dict[str, Any] = {
                "dtype": self.dtype
                if self.dtype != "auto"
                else ("auto" if has_cuda else torch.float32)
            }
            if self.device_map or has_cuda:
                kwargs["device_map"] = self.device_map or "auto"
            if self.attn_implementation:
                kwargs["attn_implementation"] = self.attn_implementation
            kwargs.update(self.model_kwargs)
            # transformers' PreTrainedModel.eval (over torch's typed one) is unannotated
            self._hf_model = AutoModelForImageTextToText.from_pretrained(  # type: ignore[no-untyped-call]
                self.model, **kwargs
            ).eval()
        _require_chat_template(self._processor, self.model)
        self._fold_system = self._folds_system()
        # generation needs left padding; many checkpoints save "right"
        self._processor.tokenizer.padding_side = "left"
        images = getattr(self._processor, "image_processor", None)
        if self.image_cache_bytes != 0 and images is not None:
            if isinstance(images, CachedImageProcessor):
                images = images.inner
            own = self.image_cache_bytes  # None: the process's image memory
            memory = ImageMemory(own) if own else None
            self._processor.image_processor = CachedImageProcessor(images, memory)
        base: Any = getattr(self._hf_model, "base_model", None)
        if self.vision_cache_bytes and callable(getattr(base, "get_image_features", None)):
            encode = base.get_image_features
            if isinstance(encode, CachedVisionEncoder):
                encode = encode.encode
            visual = getattr(base, "visual", None)  # Qwen-VL's tower merges 2x2 patches
            merge = int(getattr(visual, "spatial_merge_size", 1) or 1)
            base.get_image_features = CachedVisionEncoder(encode, merge, self.vision_cache_bytes)
        self._escape = special_token_escaper(self._processor.tokenizer)
        self._generation = BatchedGeneration(
            self._hf_model, self._processor, self.model, self.parse_tool_calls
        )
        if self.max_batch_tokens == "auto":
            model = self._hf_model
            budget = TokenBudget(None, derive=lambda: default_batch_tokens(model))
        elif self.max_batch_tokens is None or self.max_batch_tokens >= 1:
            budget = TokenBudget(self.max_batch_tokens)
        else:
            raise ValueError(
                f"max_batch_tokens must be positive, 'auto' or None, got {self.max_batch_tokens}"
            )
        self._scheduler = BatchScheduler(
            self._generation.run_batch,
            max_batch_size=self.max_batch_size,
            max_wait_s=self.max_wait_ms / 1000,
            can_join=can_join if self.join_batches else None,
            batch_tokens=self._generation.batch_tokens,
            budget=budget,
            name=f"batcher:{self.model}",
        )

    def _folds_system(self) -> bool:
        """Whether system turns are folded into the user turn (see ``system_turn``)."""
        if self.system_turn != "auto":
            return self.system_turn == "fold"
        processor = self._processor

        def render(messages: list[dict[str, Any]]) -> str:
            return str(
                processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            )

        refuses = refuses_system_turn(render)
        if refuses:
            log.info("%s: the chat template refuses a system turn; folding it into the first "
                     "user turn", self.model)  # fmt: skip
        return refuses

    @property
    def folds_system_turn(self) -> bool:
        """Whether a system message goes into the next user turn instead of a system turn of
        its own (``system_turn``; "auto": where the template refuses one)."""
        return self._fold_system

    @property
    def _llm_type(self) -> str:
        return "transformers-vlm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "max_tokens": self.max_new_tokens,
            "top_logprobs": self.top_logprobs,
            "temperature": self.temperature,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="transformers",
            ls_model_name=kwargs.get("model") or self.model,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens")
            or kwargs.get("max_new_tokens")
            or self.max_new_tokens,
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    @property
    def max_tokens(self) -> int:
        """The standard name of ``max_new_tokens``."""
        return self.max_new_tokens

    @property
    def hf_model(self) -> Any:
        return self._hf_model

    @property
    def processor(self) -> Any:
        return self._processor

    @property
    def generation(self) -> BatchedGeneration:
        """The batched ``generate`` path (what the batch worker runs on each batch)."""
        assert self._generation is not None
        return self._generation

    @property
    def scheduler(self) -> BatchScheduler:
        assert self._scheduler is not None
        return self._scheduler

    @property
    def resize_spec(self) -> ResizeSpec:
        """The frame images are sent in, by this checkpoint's processor's own rule
        (:func:`~speceyes_graph.models.families.processor_resize`)."""
        images = self._processor.image_processor
        if isinstance(images, CachedImageProcessor):
            images = images.inner
        patch = getattr(self._processor, "patch_size", None)
        merge = getattr(self._processor, "spatial_merge_size", None)
        pixtral = patch * merge if isinstance(patch, int) and isinstance(merge, int) else None
        return processor_resize(images, patch=pixtral)

    @property
    def box_coordinates(self) -> Coordinates | None:
        """How this checkpoint writes boxes, where its family documents it (None: unknown)."""
        return box_convention(getattr(self._hf_model.config, "model_type", None))

    @property
    def context_length(self) -> int | None:
        """The checkpoint's context window in tokens (what a question must fit into)."""
        config = self._hf_model.config
        text_config = getattr(config, "text_config", None) or config
        value = getattr(text_config, "max_position_embeddings", None)
        return int(value) if value else None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` with this checkpoint's tokenizer, as user text is sent."""
        tokenizer = self._processor.tokenizer
        return len(tokenizer(self._escape(text), add_special_tokens=False)["input_ids"])

    def get_num_tokens(self, text: str) -> int:
        return self.count_tokens(text)

    def bind_tools(
        self,
        tools: Sequence[BaseTool | dict[str, Any] | Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Declare tools in the prompt through the checkpoint's chat template (as trained).

        ``tool_choice``: ``"auto"`` / None (the model decides); ``"none"`` (no tools are
        declared, no calls parsed); ``"any"`` / ``"required"`` / True (the reply is started
        with ``<tool_call>``, so the model must write a call); a tool name or
        ``{"type": "function", "function": {"name": ...}}`` (only that tool is declared and
        the reply is started with the call's name). Starting the reply is as far as a local
        model can be forced: the arguments are still the model's own and may be invalid.
        """
        schemas = [convert_to_openai_tool(t) for t in tools]
        if isinstance(tool_choice, dict):
            tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        prefill = ""
        if tool_choice == "none":
            schemas = []
        elif tool_choice in _FORCING:
            prefill = "<tool_call>\n"
        elif isinstance(tool_choice, str) and tool_choice != "auto":
            schemas = [s for s in schemas if s["function"]["name"] == tool_choice]
            if not schemas:
                raise ValueError(f"tool_choice {tool_choice!r} names no bound tool")
            prefill = "<tool_call>\n" + json.dumps({"name": tool_choice})[:-1] + ', "arguments": '
        return self.bind(tools=schemas, tool_prefill=prefill, **kwargs)

    def announce(self, n: int = 1, ttl: float | None = 2.0, **call_kwargs: Any) -> None:
        """Tell the batch worker that ``n`` calls with these generation settings are coming
        (make each with ``announced=True``), so it does not launch a part-full batch
        meanwhile. A graph announces a query's first model call when the query arrives,
        before decoding its images; an announcement never made good lapses after ``ttl``."""
        key, _ = self._settings(call_kwargs.pop("stop", None), call_kwargs)
        self.scheduler.expect(key, n, ttl=ttl)

    # --- request preparation (caller's thread) -------------------------------------------------

    def _settings(
        self, stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[GenerationKey, dict[str, Any]]:
        max_new = (
            kwargs.get("max_new_tokens")
            or kwargs.get("max_tokens")
            or kwargs.get("max_completion_tokens")
            or self.max_new_tokens
        )
        top_k = kwargs.get("top_logprobs", self.top_logprobs)
        stops = tuple(stop if stop is not None else (self.stop or ()))
        temperature = float(kwargs.get("temperature", self.temperature))
        key = (int(max_new), top_k, stops, temperature)
        return key, {
            "tools": kwargs.get("tools") or [],
            "prefill": kwargs.get("tool_prefill", ""),
            "continue_final": kwargs.get("continue_final_message"),
        }

    def _prepare(
        self,
        messages: Sequence[BaseMessage],
        tools: list[dict[str, Any]] | None = None,
        prefill: str = "",
        continue_final: bool | None = None,
    ) -> dict[str, Any]:
        """Chat template, images and processor for one request; ``prefill`` starts the reply."""
        converted = convert_messages(messages, self._escape)
        template_messages = (
            fold_system(converted.messages) if self._fold_system else converted.messages
        )
        # A conversation ending in an assistant turn is continued, not answered anew (Thyme
        # continues its turn after each <sandbox_output>; servers: continue_final_message),
        # unless the call says continue_final_message=False.
        cont = bool(messages) and messages[-1].type == "ai" and continue_final is not False
        prompt = self._processor.apply_chat_template(
            template_messages,
            tools=tools or None,
            add_generation_prompt=not cont,
            continue_final_message=cont,
            tokenize=False,
        )
        # A template that writes the BOS itself (Gemma 3, Mistral) gets no second one from the
        # tokenizer: transformers' own apply_chat_template(tokenize=True) rule.
        bos = self._processor.tokenizer.bos_token
        text_kwargs = {"add_special_tokens": False} if bos and prompt.startswith(bos) else {}
        with image_keys(converted.image_keys):  # each image processed once (image_cache.py)
            inputs = self._processor(
                text=[prompt + prefill],
                # grouped per prompt: a family that treats a prompt of several images apart
                # (LLaVA-OneVision) must see them as one prompt's, not as a batch's
                images=[converted.images] if converted.images else None,
                return_tensors="pt",
                **text_kwargs,
            )
        return {
            "inputs": dict(inputs),
            "tools": bool(tools),
            "prefix": prefill,
            "image_keys": converted.image_keys,
            **self._token_counts(inputs, converted.images),
        }

    def _token_counts(self, inputs: Any, images: Sequence[Any]) -> dict[str, Any]:
        """What a request weighs in a batch's token budget, from the processor's output:
        prompt tokens (text and image placeholders), image tokens, and each image's size as
        the model sees it (Qwen-VL's image grid, else the image as sent)."""
        counts: dict[str, Any] = {"n_prompt": int(inputs["input_ids"].shape[1])}
        grid = inputs.get("image_grid_thw")
        if grid is not None:
            image_processor = self._processor.image_processor
            patch = int(getattr(image_processor, "patch_size", 14) or 14)
            merge = int(getattr(image_processor, "merge_size", 2) or 2)
            rows = [tuple(int(v) for v in row) for row in grid.tolist()]
            counts["image_tokens"] = sum(t * h * w for t, h, w in rows) // merge**2
            counts["image_sizes"] = [(w * patch, h * patch) for _, h, w in rows]
        elif images:
            image_token = getattr(self._processor, "image_token_id", None)
            if isinstance(image_token, int):
                counts["image_tokens"] = int((inputs["input_ids"] == image_token).sum())
            counts["image_sizes"] = [(int(a.shape[1]), int(a.shape[0])) for a in images]
        return counts

    # --- LangChain entry points ----------------------------------------------------------------

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """LangChain's own batch (one traced run per input), with enough inputs in flight at
        once that they meet in the same ``generate`` calls: the first wave of them (as many as
        run at once) is announced before any thread starts, so a batch does not leave while
        later threads of the wave are still starting (it did, on a loaded machine: five
        inputs went as 3 + 2)."""
        if not inputs:
            return []
        configs = get_config_list(config, len(inputs))
        width = configs[0].get("max_concurrency") or min(len(inputs), 4 * self.max_batch_size)
        configs = [{**c, "max_concurrency": width} for c in configs]
        if kwargs.get("announced"):
            return super().batch(inputs, configs, return_exceptions=return_exceptions, **kwargs)
        prepaid = _Prepaid(self, min(len(inputs), width))
        ttl = max(2.0, self.scheduler.max_expect_s)  # the wave's last thread may start late
        self.announce(prepaid.left, ttl=ttl, **kwargs)
        token = _PREPAID.set(prepaid)
        try:
            return super().batch(inputs, configs, return_exceptions=return_exceptions, **kwargs)
        finally:
            _PREPAID.reset(token)
            if prepaid.left:  # calls that never came (an input that failed before its call)
                self.announce(-prepaid.left, **kwargs)

    def _retries(self) -> dict[str, Any]:
        """tenacity's settings for a request whose generation failed: ``max_retries`` more
        attempts, at once; a missed deadline is not retried."""
        return {
            "stop": stop_after_attempt(self.max_retries + 1),
            "retry": retry_if_not_exception_type(DeadlineExceeded),
            "before_sleep": lambda state: log.warning(
                "generation failed; retrying (%d left)",
                self.max_retries + 1 - state.attempt_number,
            ),
            "reraise": True,
        }

    def _call(self, key: Hashable, prepared: dict[str, Any]) -> AIMessage:
        """One request through the batch worker, within the deadline, with retries."""
        with deadline_scope(None if self.timeout is None else time.time() + self.timeout):
            for attempt in Retrying(**self._retries()):
                with attempt:
                    # the scheduler returns what run_batch made: BatchedGeneration's AIMessage
                    return cast(AIMessage, self.scheduler.call(key, prepared))
        raise AssertionError("unreachable: tenacity reraises the last failure")

    async def _acall(self, key: Hashable, prepared: dict[str, Any]) -> AIMessage:
        """:meth:`_call` awaiting the batch worker instead of blocking a thread on it."""
        with deadline_scope(None if self.timeout is None else time.time() + self.timeout):
            async for attempt in AsyncRetrying(**self._retries()):
                with attempt:
                    return cast(AIMessage, await self.scheduler.acall(key, prepared))
        raise AssertionError("unreachable: tenacity reraises the last failure")

    def _prepare_request(
        self, key: Hashable, messages: list[BaseMessage], request: dict[str, Any]
    ) -> dict[str, Any]:
        """Prepare one request under the CPU gate; a failure withdraws its announcement."""
        try:
            with self._preparing("request preparation"):
                return self._prepare(messages, **request)
        except BaseException:
            self.scheduler.expect(key, -1)
            raise

    def _prepaid(self) -> bool:
        """Whether :meth:`batch` announced this call already (see ``_Prepaid``)."""
        prepaid = _PREPAID.get()
        return prepaid is not None and prepaid.take(self)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        announced = kwargs.pop("announced", False)
        key, request = self._settings(stop, kwargs)
        # Announce the request before preparing it (unless the caller did, earlier: see
        # announce), so that a batch being formed waits for it; withdraw it if it will not come.
        if not announced and not self._prepaid():
            self.scheduler.expect(key)
        prepared = self._prepare_request(key, messages, request)
        message = self._call(key, prepared)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """:meth:`_generate` for ``ainvoke``: the preparation (chat template, processor: CPU
        work) runs on a worker thread, the oldest query's first, then the call awaits the
        batch worker, so a thousand calls in flight hold no thread each. Same batches, same
        replies."""
        announced = kwargs.pop("announced", False)
        key, request = self._settings(stop, kwargs)
        if not announced:
            self.scheduler.expect(key)
        prepared = await to_worker_thread(self._prepare_request, key, messages, request)
        message = await self._acall(key, prepared)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Token by token from a generation in a thread of its own (the batch worker and
        other callers go on); the last chunk carries the reply's metadata and tool calls."""
        key, request = self._settings(stop, kwargs)
        if kwargs.pop("announced", False):  # a stream is not batched: nothing to wait for
            self.scheduler.expect(key, -1)
        prepared = self._prepare(messages, **request)
        # no context-variable scope here: a generator's steps may run in different contexts
        yield from stream_reply(self.generation, key, prepared, time_left(self.timeout))


def _require_chat_template(processor: Any, model: str) -> None:
    """A checkpoint without a chat template (PaliGemma ships none) fails here, saying how to
    give it one, instead of at its first call with transformers' error. A template kept only
    by the tokenizer (older checkpoints) is the processor's too."""
    if getattr(processor, "chat_template", None):
        return
    template = getattr(getattr(processor, "tokenizer", None), "chat_template", None)
    if template:
        processor.chat_template = template
        return
    raise ValueError(
        f"{model!r} has no chat template, so its prompts cannot be written. Give it the one "
        "its model card documents: ChatTransformersVLM(model=..., processor_kwargs="
        '{"chat_template": "<jinja template>"}), or save the processor with a '
        "chat_template.jinja beside it."
    )
