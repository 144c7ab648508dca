"""How queries and tool results become chat messages for a model.

The agent loop stores a standard LangChain transcript (an ``AIMessage`` with
``tool_calls``, then ``ToolMessage`` results whose content may hold images). What a model
is *sent* is a view of that transcript in its protocol:

- ``deepeyes``: the assistant turn as plain text with ``<tool_call>`` JSON, and the
  results as one **user** turn ``<tool_response>`` + image + instruction +
  ``</tool_response>``, exactly as DeepEyes was trained;
- ``native``: tool calls stay structured, tool messages keep their text, and images go in a
  user turn right after them, since OpenAI-compatible servers reject images in tool
  messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from speceyes_tools.images import ImageStore, ResizeSpec, default_store

from .protocol import format_tool_call, message_text

__all__ = ["Protocol", "image_blocks", "to_wire", "user_message"]

Protocol = Literal["deepeyes", "native"]


def image_blocks(
    images: Sequence[str] | None, resize: ResizeSpec | None = None, store: ImageStore | None = None
) -> list[dict]:
    """LangChain standard image blocks of the query's images, at the size the model uses."""
    store = store or default_store()
    return [
        {"type": "image", "base64": store.model_view(ref, resize), "mime_type": "image/png"}
        for ref in images or []
    ]


def user_message(
    images: Sequence[str] | None,
    text: str,
    resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
) -> HumanMessage:
    """Images first, then the text, as the DeepEyes and SpecEyes scripts order them."""
    return HumanMessage(
        content=[*image_blocks(images, resize, store), {"type": "text", "text": text}]
    )


def _blocks(content: object) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for block in content or []:  # type: ignore[union-attr]
        out.append({"type": "text", "text": block} if isinstance(block, str) else block)
    return out


def to_wire(
    messages: Sequence[BaseMessage], protocol: Protocol, instruction: str = ""
) -> list[BaseMessage]:
    """Render a stored transcript for the model (see the module docstring)."""
    out: list[BaseMessage] = []
    pending: list[ToolMessage] = []

    def flush() -> None:
        if not pending:
            return
        if protocol == "deepeyes":
            parts: list[dict] = [{"type": "text", "text": "<tool_response>"}]
            for tm in pending:
                parts.extend(_blocks(tm.content))
            parts += [
                {"type": "text", "text": instruction},
                {"type": "text", "text": "</tool_response>"},
            ]
            out.append(HumanMessage(content=parts))
        else:
            images: list[dict] = []
            for tm in pending:
                blocks = _blocks(tm.content)
                images.extend(b for b in blocks if b.get("type") in ("image", "image_url"))
                text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
                out.append(
                    ToolMessage(
                        content=text or "(image)", tool_call_id=tm.tool_call_id, name=tm.name
                    )
                )
            if images:
                out.append(
                    HumanMessage(
                        content=[{"type": "text", "text": "Images returned by the tools:"}, *images]
                    )
                )
        pending.clear()

    for m in messages:
        if isinstance(m, ToolMessage):
            pending.append(m)
            continue
        flush()
        if isinstance(m, AIMessage) and protocol == "deepeyes":
            text = message_text(m)
            if m.tool_calls and "<tool_call>" not in text:  # a server-side parser took the text
                text = (text + "\n" if text else "") + "\n".join(
                    format_tool_call(c["name"], c["args"]) for c in m.tool_calls
                )
            out.append(AIMessage(content=text))
        else:
            out.append(m)
    flush()
    return out
