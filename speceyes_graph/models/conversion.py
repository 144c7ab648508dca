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

Some templates refuse a system turn (Llama 3.2 Vision's raises "Prompting with images is
incompatible with system messages", even for an empty one) or drop its text. For those the
system prompt goes into the first user turn (:func:`fold_system`), as those families' users
do and as Gemma 3's own template does: :func:`refuses_system_turn` tells them apart by
rendering a probe conversation once per checkpoint.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
from langchain_core.messages import BaseMessage, ChatMessage

from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import current_store, load_image

__all__ = [
    "HFMessages",
    "SystemTurn",
    "convert_messages",
    "fold_system",
    "refuses_system_turn",
    "special_token_escaper",
    "to_hf_messages",
]

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


# How a system message reaches the chat template: "keep" as a system turn, "fold" into the
# next user turn, "auto" folded only where the template refuses a system turn.
SystemTurn = Literal["auto", "keep", "fold"]

_PROBE_SYSTEM = "Probe system prompt: answer briefly."
_PROBE_USER = "Probe question: what is shown?"


def refuses_system_turn(render: Callable[[list[dict[str, Any]]], str]) -> bool:
    """Whether a chat template refuses a system turn beside an image: rendering a system turn
    and a user turn with an image raises where the user turn alone renders (Llama 3.2
    Vision), or the system text is missing from what it renders. ``render`` renders a
    conversation with the generation prompt, untokenized. A template that cannot render
    the user turn alone either is not blamed on the system turn."""
    user = {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": _PROBE_USER}],
    }
    system = {"role": "system", "content": [{"type": "text", "text": _PROBE_SYSTEM}]}
    try:
        rendered = render([system, user])
    except Exception:  # noqa: BLE001 - any template error: is it the system turn's?
        try:
            render([user])
        except Exception:  # noqa: BLE001 - the template fails without it too
            return False
        return True
    return _PROBE_SYSTEM not in rendered and _PROBE_USER in rendered


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat-template messages with every system turn folded into the user turn after it:
    its parts first, then a blank line, then the user's (Gemma 3's template does the same
    with its system turn). An empty system turn is dropped; one with no user turn after it
    becomes a user turn of its own."""
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for message in messages:
        parts = _content_parts(message.get("content"))
        if message.get("role") == "system":
            pending.extend(p for p in parts if p.get("type") != "text" or p.get("text"))
            continue
        if message.get("role") == "user" and pending:
            message = {**message, "content": [*_separated(pending), *parts]}
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": pending})
    return out


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _separated(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A folded system prompt's parts, a blank line after them."""
    if parts[-1].get("type") == "text":
        return [*parts[:-1], {**parts[-1], "text": parts[-1]["text"] + "\n\n"}]
    return [*parts, {"type": "text", "text": "\n\n"}]
