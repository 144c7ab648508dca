"""How queries and tool results become chat messages for a model.

Messages in graph state carry images as *references*: a standard LangChain image block
whose ``url`` is a ``blob://`` key of the image store. :func:`for_model` gives a model what
it can take: a local model that reads the store itself (``accepts_image_refs``, e.g.
``ChatTransformersVLM``, called within :func:`~speceyes_tools.images.store_scope`) gets the
references as they are, so no pixels are encoded, copied or decoded per call; any other
model (a served one) gets base64 blocks from :func:`hydrate` (the bytes never enter a
checkpoint). :func:`dehydrate` does the reverse for anything arriving with pixels (a tool's
zoomed crop, an image a chat user pasted).

The agent loop stores a standard LangChain transcript (an ``AIMessage`` with
``tool_calls``, then ``ToolMessage`` results whose content may hold images). What a model
is *sent* is a view of that transcript in its protocol (:func:`to_wire`):

- ``deepeyes``: the assistant turn as plain text with ``<tool_call>`` JSON, and the
  results as one **user** turn ``<tool_response>`` + image + instruction +
  ``</tool_response>``, exactly as DeepEyes was trained;
- ``thyme``: the whole reply is **one** assistant turn: each step's text (with its
  ``<code>``), then ``<sandbox_output>`` + the images the code produced (or its printed
  result, or its error) + ``</sandbox_output>``, and the model continues that same turn, as
  Thyme was trained and the published harness runs it;
- ``native``: tool calls stay structured, tool messages keep their text, and images go in a
  user turn right after them, since OpenAI-compatible servers reject images in tool
  messages. That turn is a ``ChatMessage(role="user")`` for a model whose integration sends
  one as a user turn (:func:`takes_chat_role`: ``ChatOpenAI`` and the package's models), so
  middlewares that read "the last user message" (LangChain's ``LLMToolSelectorMiddleware``)
  still find the user's question, not the tools' images; a ``HumanMessage`` for any other
  model (Anthropic's integration, for one, has no ``ChatMessage``).

:func:`wire_messages` is all of it for one call: the frame, the protocol, the images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, ToolMessage

from speceyes_tools.attachments import Attachment, read_attachment
from speceyes_tools.blobs import is_blob_key
from speceyes_tools.images import ImageStore, ResizeSpec, default_store
from speceyes_tools.sources import ImageLoadError

from ._compat import cache_content_block_types
from .protocol import format_tool_call, message_text

__all__ = [
    "Protocol",
    "accepts_image_refs",
    "bare_model",
    "block_metadata",
    "cannot_read",
    "dehydrate",
    "for_model",
    "hydrate",
    "image_blocks",
    "in_frame",
    "image_ref",
    "is_unreadable",
    "not_an_image",
    "reference_block",
    "readable_images",
    "takes_chat_role",
    "unreadable",
    "to_wire",
    "user_message",
    "wire_messages",
]

Protocol = Literal["deepeyes", "native", "thyme"]
_Message = TypeVar("_Message", bound=BaseMessage)


cache_content_block_types()  # tracing image blocks without re-reading type hints


def image_blocks(
    images: Sequence[str] | None, resize: ResizeSpec | None = None, store: ImageStore | None = None
) -> list[dict]:
    """Reference blocks of the query's images, at the size the model uses."""
    store = store or default_store()
    return [
        {"type": "image", "url": store.model_view(ref, resize), "mime_type": "image/png"}
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


def _blocks(content: str | Sequence[str | dict] | None) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict] = []
    for block in content or []:
        out.append({"type": "text", "text": block} if isinstance(block, str) else block)
    return out


# --- references <-> pixels ---------------------------------------------------------------------


STORED = "speceyes_image"
"""The metadata key under which a displayed image block (a thumbnail a chat message keeps,
:mod:`speceyes_graph.integrations.chat`) names the stored image it shows."""


def image_ref(block: Any) -> str | None:
    """The ``blob://`` key an image block stands for, else None: a reference block's, or
    the stored image a displayed one (a thumbnail) names in its metadata. A model is
    always sent the stored image, never the thumbnail."""
    if not isinstance(block, dict) or block.get("type") != "image":
        return None
    if is_blob_key(block.get("url")):
        return str(block["url"])
    stored = block_metadata(block).get(STORED)
    return str(stored) if is_blob_key(stored) else None


def reference_block(key: str, mime_type: str | None = None, name: str | None = None) -> dict:
    """A reference to a stored image, with the file name the person sent it under."""
    block: dict[str, Any] = {"type": "image", "url": key, "mime_type": mime_type or "image/png"}
    if name:
        block["metadata"] = {"name": name}
    return block


def _map_images(message: _Message, fn: Callable[[Any], Any]) -> _Message:
    if not isinstance(message.content, list):
        return message
    changed, content = False, []
    for block in message.content:
        new = fn(block)
        changed |= new is not block
        content.append(new)
    return message.model_copy(update={"content": content}) if changed else message


def hydrate(messages: Sequence[BaseMessage], store: ImageStore | None = None) -> list[BaseMessage]:
    """Messages for a model call: reference blocks replaced by base64 blocks."""
    store = store or default_store()

    def fill(block: Any) -> Any:
        key = image_ref(block)
        if key is None:
            return block
        data, mime = store.base64(key)
        return {"type": "image", "base64": data, "mime_type": mime}

    return [_map_images(m, fill) for m in messages]


def bare_model(model: Any) -> Any:
    """The chat model under any bindings (``with_config``, ``bind``), to read its traits."""
    while hasattr(model, "bound"):
        model = model.bound
    return model


def accepts_image_refs(model: Any) -> bool:
    """Whether a model (or a binding of one) resolves ``blob://`` references itself."""
    return bool(getattr(bare_model(model), "accepts_image_refs", False))


def takes_chat_role(model: Any) -> bool:
    """Whether a model (or a binding of one) sends a ``ChatMessage(role="user")`` as a user
    turn: langchain-openai's models do, and the package's own (``takes_chat_role``)."""
    bare = bare_model(model)
    if getattr(bare, "takes_chat_role", False):
        return True
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:  # an extra: without it no model is one
        return False
    return isinstance(bare, BaseChatOpenAI)


def wire_messages(
    messages: Sequence[BaseMessage], model: Any, store: ImageStore
) -> list[BaseMessage]:
    """What a user's own agent's model is sent for ``messages`` of the state: the query's
    images in the model's frame (:func:`in_frame`), the tools' images in a user turn after
    them (the ``native`` protocol of :func:`to_wire`), pixels as the model takes them
    (:func:`for_model`)."""
    bare = bare_model(model)
    framed = in_frame(messages, getattr(bare, "resize_spec", None), store)
    if any(isinstance(m, ToolMessage) and _has_image(m) for m in framed):
        framed = to_wire(framed, "native", chat_role=takes_chat_role(bare))
    return for_model(framed, bare, store)


def _has_image(message: BaseMessage) -> bool:
    return any(b.get("type") in ("image", "image_url") for b in _blocks(message.content))


def for_model(
    messages: Sequence[BaseMessage], model: Any, store: ImageStore | None = None
) -> list[BaseMessage]:
    """Messages as ``model`` takes them: references kept for a model that reads the store
    (call it within ``store_scope(store)``), base64 for any other. What a chat keeps for
    the person is sent as what it stands for: a thumbnail as its stored image, a file that
    was not read as a note saying so."""
    messages = [_map_images(m, _as_sent) for m in messages]
    return messages if accepts_image_refs(model) else hydrate(messages, store)


def _as_sent(block: Any) -> Any:
    key = image_ref(block)
    if key is not None and block.get("url") != key:  # a thumbnail: the image it shows
        return reference_block(key, None, block_metadata(block).get("name"))
    if _not_read(block):
        name = block_metadata(block).get("filename") or "a file"
        return {"type": "text", "text": f"[{name}: {block_metadata(block)[NOT_READ]}, not read]"}
    return block


def in_frame(
    messages: Sequence[BaseMessage], resize: ResizeSpec | None, store: ImageStore
) -> list[BaseMessage]:
    """The human messages' stored images as the model sees them (:meth:`ImageStore.model_view
    <speceyes_tools.images.ImageStore.model_view>`: resized to its frame), as
    :func:`user_message` sends a query's images; tool results and URLs are left as they are."""
    if resize is None:
        return list(messages)

    def view(block: Any) -> Any:
        key = image_ref(block)
        if key is None:
            return block
        return {"type": "image", "url": store.model_view(key, resize), "mime_type": "image/png"}

    return [_map_images(m, view) if isinstance(m, HumanMessage) else m for m in messages]


def dehydrate(
    message: _Message, store: ImageStore | None = None, *, background: bool = False
) -> _Message:
    """The message with inline image data moved into the store (reference blocks instead);
    ``background``: the store writes them in the background (:meth:`ImageStore.put
    <speceyes_tools.images.ImageStore.put>`), for a caller on an event loop."""
    store = store or default_store()

    def keep(block: Any) -> Any:
        if image_ref(block) or _not_read(block):
            return block
        found = read_attachment(block)
        if found is not None and found.file_id:
            why = f"it is another service's file ({found.file_id}), which cannot be read here"
            return unreadable(f"{found.label}: {why}; send the image itself")
        if found is None or (found.data is None and found.problem is None):
            return block  # not an attachment, or one by URL: read_images checks those
        if found.problem:
            return unreadable(f"{found.label}: {found.problem}")
        assert found.data is not None
        if found.block_type == "file" and not found.is_image:
            return not_an_image(found)
        key = store.put(found.data, background=background)
        return reference_block(key, found.mime_type, found.name)

    return _map_images(message, keep)


def not_an_image(found: Attachment) -> dict[str, Any]:
    """What a message keeps of a file that is not an image: its name and type, for the
    person to see what they sent (as LangChain JS's file blocks show it), not its bytes."""
    return {
        "type": "file",
        "mimeType": found.mime_type or "application/octet-stream",
        "metadata": {"filename": found.label, NOT_READ: "not an image"},
    }


NOT_READ = "speceyes_not_read"
"""The metadata key of a file block kept without its data: why it was not read."""


def _not_read(block: Any) -> bool:
    return bool(block_metadata(block).get(NOT_READ))


def block_metadata(block: Any) -> dict[str, Any]:
    """A content block's ``metadata`` (LangChain JS's place for a file's name), else {}."""
    metadata = block.get("metadata") if isinstance(block, dict) else None
    return metadata if isinstance(metadata, dict) else {}


UNREADABLE_NOTE = "[An image here could not be read: "


def unreadable(why: str) -> dict[str, str]:
    """The text block an image that cannot be read is replaced with: the turn says so, and
    the thread keeps no block that would fail every later model call."""
    return {"type": "text", "text": f"{UNREADABLE_NOTE}{why}]"}


def is_unreadable(block: Any) -> bool:
    """Whether a block is :func:`unreadable`'s note."""
    text = block.get("text") if isinstance(block, dict) else None
    return isinstance(text, str) and text.startswith(UNREADABLE_NOTE)


def readable_images(message: _Message, store: ImageStore | None = None) -> _Message:
    """The message with each image the store cannot read (under its policy: a URL or path it
    does not allow, too large, not an image, truncated) replaced by :func:`unreadable`. The
    readable ones are decoded now, into the store's cache, where the model's call finds
    them; a URL's becomes its image's key (fetched once)."""
    store = store or default_store()

    def check(block: Any) -> Any:
        ref = _image_location(block)
        if ref is None:
            return block
        name = block_metadata(block).get("name")
        try:
            key = store.intern(ref)  # a URL is fetched once, and kept by its key
            store.get(key)
        except ImageLoadError as exc:
            return unreadable(cannot_read(exc, ref, name))
        if key == ref:
            return block
        return reference_block(key, block.get("mime_type"), name)

    return _map_images(message, check)


def cannot_read(exc: Exception, ref: str, name: str | None) -> str:
    """Why an image cannot be read, said of the file the person sent (its name, when it
    came with one), not of the store's key for it."""
    if not is_blob_key(ref):  # a URL or path: the error names it as the person wrote it
        return f"{name or 'the image'}: {exc}"
    name = name or "your image"
    return f"{name}: " + str(exc).replace(f"image {ref}", "it").replace(ref, name)


def _image_location(block: Any) -> str | None:
    """Where an image block's picture is (a key, URL or path), else None."""
    key = image_ref(block)
    if key:
        return key
    found = read_attachment(block)
    if found is None or not found.location or found.block_type == "file":
        return None
    return found.location


# --- the wire format of each protocol ----------------------------------------------------------


def _closed(text: str) -> str:
    """The turn as the model wrote it: a stop string (``</tool_call>``, ``</answer>``) ends
    generation and is not returned (OpenAI semantics), but the model produced it and the
    published transcript keeps it."""
    for tag in ("tool_call", "answer", "code"):
        opened, closed = text.rfind(f"<{tag}>"), text.rfind(f"</{tag}>")
        if opened >= 0 and closed < opened:
            return text + f"</{tag}>"
    return text


def to_wire(
    messages: Sequence[BaseMessage],
    protocol: Protocol,
    instruction: str = "",
    tool_response_text: bool = False,
    chat_role: bool = False,
) -> list[BaseMessage]:
    """Render a stored transcript for the model (see the module docstring).

    In the ``deepeyes`` protocol a tool result goes back as DeepEyes was trained and the
    paper evaluated it: ``<tool_response>`` + the image + the instruction +
    ``</tool_response>``. The tool's own text (the box in original pixels, the size) is left
    out unless ``tool_response_text``; a result without an image (an error) keeps its text.
    ``chat_role``: the ``native`` protocol's image turn is a ``ChatMessage(role="user")``
    (see the module docstring), not a ``HumanMessage``.
    """
    out: list[BaseMessage] = []
    pending: list[ToolMessage] = []

    def flush() -> None:
        if not pending:
            return
        if protocol == "deepeyes":
            parts: list[str | dict] = [{"type": "text", "text": "<tool_response>"}]
            for tm in pending:
                blocks = _blocks(tm.content)
                has_image = any(b.get("type") in ("image", "image_url") for b in blocks)
                if has_image and not tool_response_text:
                    blocks = [b for b in blocks if b.get("type") != "text"]
                parts.extend(blocks)
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
                content: list[str | dict] = [
                    {"type": "text", "text": "Images returned by the tools:"},
                    *images,
                ]
                out.append(
                    ChatMessage(role="user", content=content)
                    if chat_role
                    else HumanMessage(content=content)
                )
        pending.clear()

    if protocol == "thyme":
        return _thyme_wire(messages)
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
            out.append(AIMessage(content=_closed(text)))
        else:
            out.append(m)
    flush()
    return out


def _thyme_wire(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Everything after the user turn merged into one assistant turn (see the module
    docstring); a model continues it when it is the last message."""
    out: list[BaseMessage] = []
    turn: list[str | dict] = []
    for m in messages:
        if isinstance(m, AIMessage):
            turn.append({"type": "text", "text": _closed(message_text(m))})
        elif isinstance(m, ToolMessage):
            turn.append({"type": "text", "text": "<sandbox_output>"})
            turn.extend(_blocks(m.content))
            turn.append({"type": "text", "text": "</sandbox_output>"})
        else:
            if turn:
                out.append(AIMessage(content=turn))
                turn = []
            out.append(m)
    if turn:
        out.append(AIMessage(content=turn))
    return out
