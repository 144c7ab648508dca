"""LangChain messages -> what a Hugging Face chat template and processor take.

Images may arrive as LangChain standard blocks (``base64``, ``url``, raw ``data``), OpenAI
``image_url`` blocks, or ``blob://`` references of the current image store
(:func:`~speceyes_tools.images.store_scope`; the graph passes references, so a local model
reads the pixels the store already holds: no base64, no PNG decode). Text from
messages is untrusted: a question containing ``<|im_end|>\\n<|im_start|>assistant`` must not
become real control tokens and forge a turn, so the checkpoint's special-token strings are
escaped (a zero-width space after their first character) before templating; they then
tokenize as ordinary text. Strings that are added tokens but not special (``<tool_call>``,
``<think>``) are left alone: the protocols use them as text.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from langchain_core.messages import BaseMessage, ChatMessage

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import current_store, load_image

__all__ = ["HFMessages", "convert_messages", "special_token_escaper", "to_hf_messages"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_ZWSP = "\u200b"


def special_token_escaper(tokenizer: Any) -> Callable[[str], str]:
    """A function that makes the tokenizer's special-token strings inert in user text."""
    specials: set[str] = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            specials.add(added.content)
    specials = {s for s in specials if len(s) > 1}
    if not specials:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda m: m[0][0] + _ZWSP + m[0][1:], text)


def _pixels(ref: str) -> tuple[np.ndarray, str | None]:
    """A ``blob://`` reference from the current image store (with its key, which names the
    content), or any URL / path (uncached, unnamed)."""
    if is_blob_key(ref):
        return current_store().get(ref), ref
    return load_image(ref), None


def _block_image(block: dict[str, Any]) -> tuple[np.ndarray, str | None] | None:
    """(pixels, content key or None) of a LangChain / OpenAI image block; None if not one."""
    kind = block.get("type")
    if kind == "image_url":
        url: Any = block.get("image_url")  # {"url": ...} or the URL itself
        return _pixels(url["url"] if isinstance(url, dict) else url)
    if kind != "image":
        return None
    if block.get("base64") or block.get("source_type") == "base64":
        data = block.get("base64") or block.get("data")
        mime = block.get("mime_type", "image/png")
        return load_image(f"data:{mime};base64,{data}"), None
    if block.get("url"):
        return _pixels(block["url"])
    if block.get("data") is not None:  # raw bytes
        raw = block["data"]
        return load_image("data:image/png;base64," + base64.b64encode(raw).decode()), None
    raise ValueError(
        f"unsupported image block: { {k: v for k, v in block.items() if k != 'base64'} }"
    )


def _parts(content: Any) -> Iterable[Any]:
    return content if isinstance(content, list) else [content]


class HFMessages(NamedTuple):
    messages: list[dict[str, Any]]  # for the chat template
    images: list[np.ndarray]  # in order of appearance
    image_keys: list[str | None]  # the blob key naming each image's content, if it has one


def to_hf_messages(
    messages: Sequence[BaseMessage], escape: Callable[[str], str] | None = None
) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """LangChain messages -> (chat-template messages, images in order of appearance).

    ``escape`` (from :func:`special_token_escaper`) is applied to every text part.
    """
    converted = convert_messages(messages, escape)
    return converted.messages, converted.images


def convert_messages(
    messages: Sequence[BaseMessage], escape: Callable[[str], str] | None = None
) -> HFMessages:
    """:func:`to_hf_messages`, also naming each image by its content key (for caches)."""
    escape = escape or (lambda text: text)
    out: list[dict[str, Any]] = []
    images: list[np.ndarray] = []
    keys: list[str | None] = []
    for m in messages:
        role = _ROLES.get(m.type)
        if isinstance(m, ChatMessage) and m.role in _ROLES.values():  # the tools' image turn
            role = m.role
        if role is None:
            raise ValueError(f"unsupported message type {m.type!r}")
        parts: list[dict[str, Any]] = []
        for block in _parts(m.content):
            if isinstance(block, str):
                if block:
                    parts.append({"type": "text", "text": escape(block)})
                continue
            image = _block_image(block)
            if image is not None:
                images.append(image[0])
                keys.append(image[1])
                parts.append({"type": "image"})
            elif block.get("type") == "text":
                parts.append({"type": "text", "text": escape(block.get("text", ""))})
        entry: dict[str, Any] = {"role": role, "content": parts}
        tool_calls = getattr(m, "tool_calls", None)  # an AIMessage's
        if role == "assistant" and tool_calls:
            entry["tool_calls"] = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in tool_calls
            ]
        out.append(entry)
    return HFMessages(out, images, keys)
