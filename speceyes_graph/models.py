"""Local Hugging Face vision-language models as LangChain chat models, batched across queries.

:class:`ChatTransformersVLM` loads any image-text-to-text checkpoint (Qwen2.5-VL fine-tunes
such as DeepEyes or Thyme, Qwen3-VL, ...) through ``AutoProcessor`` /
``AutoModelForImageTextToText`` and renders LangChain messages with the checkpoint's own
chat template. Decoding is greedy by default. With ``top_logprobs=K`` every reply carries
the top-K log-probs of each generated token in ``response_metadata["logprobs"]`` in the
OpenAI format, so the SpecEyes gate treats local and served models the same way.

Concurrent calls (``graph.batch``, ``abatch``, threads, asyncio) are coalesced by a
:class:`~speceyes_graph.batching.BatchScheduler` into left-padded batched ``generate``
calls, one queue per generation setting. Each request is prepared (chat template, image
decoding, processor) in its caller's thread, so a broken image fails only that caller and
preprocessing overlaps with the model's work.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import ResizeSpec, default_store, load_image

from .batching import BatchScheduler
from .protocol import parse_deepeyes

__all__ = ["ChatTransformersVLM", "to_hf_messages"]

log = logging.getLogger(__name__)

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_PRELOADED = threading.local()  # hands a built model to __init__ (see from_components)


def _pixels(ref: str) -> np.ndarray:
    """A ``blob://`` reference from the default image store, or any URL / path (uncached)."""
    return default_store().get(ref) if is_blob_key(ref) else load_image(ref)


def _block_image(block: dict) -> np.ndarray | None:
    """Pixels of a LangChain / OpenAI image content block, or None if it is not an image."""
    kind = block.get("type")
    if kind == "image_url":
        url = (
            block["image_url"]["url"]
            if isinstance(block.get("image_url"), dict)
            else block.get("image_url")
        )
        return _pixels(url)
    if kind != "image":
        return None
    if block.get("base64") or block.get("source_type") == "base64":
        data = block.get("base64") or block.get("data")
        mime = block.get("mime_type", "image/png")
        return load_image(f"data:{mime};base64,{data}")
    if block.get("url"):
        return _pixels(block["url"])
    if block.get("data") is not None:  # raw bytes
        raw = block["data"]
        return load_image("data:image/png;base64," + base64.b64encode(raw).decode())
    raise ValueError(
        f"unsupported image block: { {k: v for k, v in block.items() if k != 'base64'} }"
    )


def to_hf_messages(messages: Sequence[BaseMessage]) -> tuple[list[dict], list[np.ndarray]]:
    """LangChain messages -> (chat-template messages, images in order of appearance)."""
    out: list[dict] = []
    images: list[np.ndarray] = []
    for m in messages:
        role = _ROLES.get(m.type)
        if role is None:
            raise ValueError(f"unsupported message type {m.type!r}")
        parts: list[dict] = []
        content = m.content if isinstance(m.content, list) else [m.content]
        for block in content:
            if isinstance(block, str):
                if block:
                    parts.append({"type": "text", "text": block})
                continue
            image = _block_image(block)
            if image is not None:
                images.append(image)
                parts.append({"type": "image"})
            elif block.get("type") == "text":
                parts.append({"type": "text", "text": block.get("text", "")})
        entry: dict[str, Any] = {"role": role, "content": parts}
        if role == "assistant" and getattr(m, "tool_calls", None):
            entry["tool_calls"] = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in m.tool_calls
            ]
        out.append(entry)
    return out, images


class ChatTransformersVLM(BaseChatModel):
    """A local image-text-to-text checkpoint as a batched LangChain chat model.

    Example::

        small = ChatTransformersVLM(model="Qwen/Qwen3-VL-2B-Instruct", top_logprobs=64, max_new_tokens=20)
        large = ChatTransformersVLM(model="ChenShawn/DeepEyes-7B", max_new_tokens=512)
    """

    model: str = Field(description="Local path or hub id of the checkpoint.")
    top_logprobs: int | None = Field(
        default=None, description="Return the top-K log-probs of each token."
    )
    max_new_tokens: int = 512
    temperature: float = 0.0
    stop: list[str] | None = None
    dtype: str = "auto"
    device_map: str | None = None
    attn_implementation: str | None = None
    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    parse_tool_calls: bool = True
    processor_kwargs: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(arbitrary_types_allowed=True)

    handles_deadlines: ClassVar[bool] = True  # waits are bounded by the caller's deadline

    _hf_model: Any = PrivateAttr(default=None)
    _processor: Any = PrivateAttr(default=None)
    _scheduler: BatchScheduler | None = PrivateAttr(default=None)

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
            self._processor.tokenizer.padding_side = "left"
            self._start_scheduler()
            return
        self._processor = AutoProcessor.from_pretrained(self.model, **self.processor_kwargs)
        tokenizer = self._processor.tokenizer
        tokenizer.padding_side = (
            "left"  # generation needs left padding; many checkpoints save "right"
        )
        has_cuda = torch.cuda.is_available()
        kwargs: dict[str, Any] = {
            "dtype": self.dtype if self.dtype != "auto" else ("auto" if has_cuda else torch.float32)
        }
        if self.device_map or has_cuda:
            kwargs["device_map"] = self.device_map or "auto"
        if self.attn_implementation:
            kwargs["attn_implementation"] = self.attn_implementation
        kwargs.update(self.model_kwargs)
        self._hf_model = AutoModelForImageTextToText.from_pretrained(self.model, **kwargs).eval()
        self._start_scheduler()

    def _start_scheduler(self) -> None:
        self._scheduler = BatchScheduler(
            self._run_batch,
            max_batch_size=self.max_batch_size,
            max_wait_s=self.max_wait_ms / 1000,
            name=f"batcher:{self.model}",
        )

    @property
    def _llm_type(self) -> str:
        return "transformers-vlm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "max_new_tokens": self.max_new_tokens,
            "top_logprobs": self.top_logprobs,
        }

    @property
    def hf_model(self) -> Any:
        return self._hf_model

    @property
    def processor(self) -> Any:
        return self._processor

    @property
    def scheduler(self) -> BatchScheduler:
        assert self._scheduler is not None
        return self._scheduler

    @property
    def resize_spec(self) -> ResizeSpec:
        """How this checkpoint's processor resizes images: the frame of its boxes."""
        ip = self._processor.image_processor
        size = getattr(ip, "size", None) or {}
        factor = int(ip.patch_size * getattr(ip, "merge_size", 2))
        min_pixels = int(
            size.get("shortest_edge") or getattr(ip, "min_pixels", None) or factor * factor
        )
        max_pixels = int(
            size.get("longest_edge") or getattr(ip, "max_pixels", None) or 1280 * factor * factor
        )
        return ResizeSpec(factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)

    @property
    def context_length(self) -> int | None:
        """The checkpoint's context window in tokens (what a question must fit into)."""
        config = self._hf_model.config
        text_config = getattr(config, "text_config", None) or config
        value = getattr(text_config, "max_position_embeddings", None)
        return int(value) if value else None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` with this checkpoint's tokenizer (special strings as plain text)."""
        tokenizer = self._processor.tokenizer
        return len(
            tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        )

    def get_num_tokens(self, text: str) -> int:
        return self.count_tokens(text)

    def bind_tools(
        self, tools: Sequence[BaseTool | dict | Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Declare tools in the prompt through the checkpoint's chat template (as trained)."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    # --- request preparation (caller's thread) -------------------------------------------------

    def _settings(self, stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[Hashable, dict]:
        max_new = kwargs.get("max_new_tokens") or kwargs.get("max_tokens") or self.max_new_tokens
        top_k = kwargs.get("top_logprobs", self.top_logprobs)
        stops = tuple(stop if stop is not None else (self.stop or ()))
        temperature = float(kwargs.get("temperature", self.temperature))
        key = (int(max_new), top_k, stops, temperature)
        return key, {"tools": kwargs.get("tools")}

    def _prepare(self, messages: Sequence[BaseMessage], tools: list[dict] | None) -> dict:
        hf_messages, images = to_hf_messages(messages)
        prompt = self._processor.apply_chat_template(
            hf_messages, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        inputs = self._processor(text=[prompt], images=images or None, return_tensors="pt")
        return {"inputs": dict(inputs), "tools": bool(tools)}

    # --- batched generation (worker thread) -----------------------------------------------------

    def _collate(self, prepared: Sequence[dict]) -> dict:
        import torch

        pad_id = self._processor.tokenizer.pad_token_id
        lengths = [p["inputs"]["input_ids"].shape[1] for p in prepared]
        longest = max(lengths)
        batch: dict[str, Any] = {}
        keys = {k for p in prepared for k in p["inputs"]}
        for key in keys:
            values = [p["inputs"].get(key) for p in prepared]
            first = next(v for v in values if v is not None)
            sequence_aligned = all(
                v is not None and v.ndim == 2 and v.shape[1] == n
                for v, n in zip(values, lengths, strict=True)
            )
            if sequence_aligned:
                fill = pad_id if key == "input_ids" else 0
                padded = first.new_full((len(prepared), longest), fill)
                for i, (v, n) in enumerate(zip(values, lengths, strict=True)):
                    padded[i, longest - n :] = v[0]
                batch[key] = padded
            else:  # pixel values and grids: concatenated in request order
                batch[key] = torch.cat([v for v in values if v is not None], dim=0)
        device = self._hf_model.device
        return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}

    def _run_batch(self, key: Hashable, prepared: Sequence[dict]) -> list[Any]:
        import torch

        max_new, top_k, stops, temperature = key  # type: ignore[misc]
        tokenizer = self._processor.tokenizer
        inputs = self._collate(prepared)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "return_dict_in_generate": True,
            "output_logits": bool(top_k),
            "pad_token_id": tokenizer.pad_token_id,
        }
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stops:
            gen_kwargs.update(stop_strings=list(stops), tokenizer=tokenizer)
        with torch.inference_mode():
            out = self._hf_model.generate(**inputs, **gen_kwargs)
        prompt_len = inputs["input_ids"].shape[1]
        generated = out.sequences[:, prompt_len:].tolist()
        step_top = None
        if top_k:  # per step: log-softmax of the raw logits, top-K only (never [B, T, V] at once)
            step_top = []
            for logits in out.logits:
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                values, ids = torch.topk(logprobs, int(top_k), dim=-1)
                step_top.append((values.cpu(), ids.cpu(), logprobs))
        eos = set(_as_list(self._hf_model.generation_config.eos_token_id)) | {
            tokenizer.pad_token_id
        }
        results = []
        for b, tokens in enumerate(generated):
            results.append(self._decode(b, tokens, eos, stops, step_top, prepared[b]["tools"]))
        return results

    def _decode(
        self, b: int, tokens: list[int], eos: set, stops: tuple, step_top, tools: bool
    ) -> AIMessage:
        tokenizer = self._processor.tokenizer
        n = next(
            (i for i, t in enumerate(tokens) if t in eos), len(tokens)
        )  # up to the first eos/pad
        finish = "stop" if n < len(tokens) else "length"
        tokens = tokens[:n]
        pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        kept = len(tokens)
        for s in stops:  # OpenAI semantics: the stop string is not part of the reply
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
                finish = "stop"
                acc, kept = "", 0
                for piece in pieces:
                    if len(acc) >= cut:
                        break
                    acc += piece
                    kept += 1
        metadata: dict[str, Any] = {"model_name": self.model, "finish_reason": finish}
        if step_top is not None:
            content = []
            for t in range(kept):
                values, ids, full = step_top[t]
                chosen = tokens[t]
                top = [
                    {"token": tokenizer.decode([int(i)]), "logprob": float(v)}
                    for v, i in zip(values[b].tolist(), ids[b].tolist(), strict=True)
                ]
                content.append(
                    {"token": pieces[t], "logprob": float(full[b, chosen]), "top_logprobs": top}
                )
            metadata["logprobs"] = {"content": content}
        message = AIMessage(content=text, response_metadata=metadata)
        if tools and self.parse_tool_calls and "<tool_call>" in text:
            parsed = parse_deepeyes(text)
            if parsed.answer is None and parsed.tool_calls:
                message = AIMessage(
                    content=text, tool_calls=parsed.tool_calls, response_metadata=metadata
                )
        return message

    # --- LangChain entry points ------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        key, extra = self._settings(stop, kwargs)
        prepared = self._prepare(messages, extra["tools"])
        message = self.scheduler.call(key, prepared)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        key, extra = self._settings(stop, kwargs)
        prepared = await asyncio.to_thread(self._prepare, messages, extra["tools"])
        message = await self.scheduler.acall(key, prepared)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage | Exception]:
        """Submit every input at once so they share batched ``generate`` calls."""
        if not inputs:
            return []
        key, extra = self._settings(kwargs.pop("stop", None), kwargs)
        prepared: list[Any] = []
        for item in inputs:
            try:
                prepared.append(
                    self._prepare(self._convert_input(item).to_messages(), extra["tools"])
                )
            except Exception as exc:
                if not return_exceptions:
                    raise
                prepared.append(exc)
        futures = self.scheduler.submit_many(
            key, [p for p in prepared if not isinstance(p, Exception)]
        )
        results: list[Any] = []
        it = iter(futures)
        for p in prepared:
            if isinstance(p, Exception):
                results.append(p)
                continue
            try:
                results.append(next(it).result())
            except Exception as exc:
                if not return_exceptions:
                    raise
                results.append(exc)
        return results


def _as_list(x: Any) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]
