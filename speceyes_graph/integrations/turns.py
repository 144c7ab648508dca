"""A chat turn read as a SpecEyes query: question, options and images from messages.

The chat graph (:func:`~speceyes_graph.integrations.chat.create_speceyes_chat_graph`) and the
middleware in front of a LangChain agent
(:class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware`) both take their query from the last
human message of a conversation: its text is the question, an ``Options:`` line in it starts
the multiple-choice options (:func:`split_options`), and its image blocks (pasted images,
URLs, the image store's ``blob://`` keys) are the images; a follow-up without an image asks
about the latest image of the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, convert_to_messages

from speceyes_tools.attachments import read_attachment
from speceyes_tools.images import ImageStore

from ..messages import dehydrate, image_ref
from ..protocol import message_text
from ..state import on_event_loop

__all__ = [
    "chat_query",
    "image_blocks_of",
    "pasted_images_kept",
    "split_options",
    "turn_images",
]

_QUESTION_LABEL = re.compile(r"^\s*question[ \t]*:[ \t]*", re.IGNORECASE)
_OPTIONS_LINE = re.compile(r"^[ \t]*options[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_LABEL = re.compile(r"^(?:\(([A-Z])\)|([A-Z])[.):])\s+")  # "(A) ", "A. ", "A) ", "A: "
_INLINE_LABEL = re.compile(r"(?:^|\s)(?:\(([A-Z])\)|([A-Z])[.)])\s+")


def _inline_options(text: str) -> list[str]:
    """Options written on the ``Options:`` line: labelled ``A. red B. green`` / ``(A) red
    (B) green`` when the labels run A, B, C..., else separated by ``;`` or ``|``, else ``,``."""
    labels = list(_INLINE_LABEL.finditer(text))
    letters = [m.group(1) or m.group(2) for m in labels]
    if len(labels) >= 2 and letters == [chr(65 + i) for i in range(len(labels))]:
        if not text[: labels[0].start()].strip():
            ends = [m.start() for m in labels[1:]] + [len(text)]
            return [text[m.end() : end].strip() for m, end in zip(labels, ends)]
    for separator in (";", "|", ","):
        if separator in text:
            return [part.strip() for part in text.split(separator)]
    return [text.strip()]


def split_options(text: str) -> tuple[str, list[str] | None]:
    """(question, options) of a chat message: an ``Options:`` line ends the question.

    The options follow it one per line (a label ``A.``, ``A)``, ``(A)`` or ``A:`` is dropped),
    or on the ``Options:`` line itself: ``Options: red; green; blue`` (``|`` or ``,`` work
    too) or ``Options: (A) red (B) green``. A leading ``Question:`` label is dropped as well,
    so a message written in the models' own prompt layout
    (:func:`~speceyes_graph.prompts.format_question`) reads back as the query it was made
    from. Without an ``Options:`` line the whole text is the question and there are none.
    """
    found = _OPTIONS_LINE.search(text)
    question, rest = (text, "") if found is None else (text[: found.start()], text[found.end() :])
    question = _QUESTION_LABEL.sub("", question, count=1).strip()
    if found is None:
        return question, None
    first, _, following = rest.partition("\n")
    options = _inline_options(first) if first.strip() else []
    for line in following.splitlines():
        line = line.strip()
        if line:
            label = _LABEL.match(line)
            options.append(line[label.end() :].strip() if label else line)
    options = [o for o in options if o]
    return question, options or None


def image_blocks_of(message: BaseMessage) -> list[dict[str, Any]]:
    """A message's images: blocks of any shape a chat client sends
    (:func:`~speceyes_tools.attachments.read_attachment`), files holding an image too."""
    content = message.content if isinstance(message.content, list) else []
    return [b for b in content if isinstance(b, dict) and _block_reference(b)]


def _block_reference(block: dict[str, Any]) -> str | None:
    """The reference an image block points at: a ``blob://`` key (a pasted image, moved into
    the store as the turn came in), a URL (``data:`` too) or a path."""
    key = image_ref(block)
    if key:
        return key
    found = read_attachment(block)
    if found is None or not found.location or not found.is_image:
        return None
    return found.location


def turn_images(messages: Sequence[BaseMessage]) -> list[str]:
    """The images a turn asks about: those of the last human message that has any."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            images = [r for r in map(_block_reference, image_blocks_of(message)) if r]
            if images:
                return images
    return []


def chat_query(messages: Sequence[BaseMessage]) -> dict[str, Any] | None:
    """The SpecEyes query of a chat turn, or None when there is no question: the last human
    message's text (:func:`split_options`) and its images, else the latest images of the
    conversation (a follow-up question)."""
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    if not humans:
        return None
    question, options = split_options(message_text(humans[-1]))
    if not question:
        return None
    return {"question": question, "images": turn_images(humans), "options": options}


def pasted_images_kept(value: Any, store: ImageStore) -> Any:
    """A chat run's input with every pasted image moved into ``store``: each message that
    carries one becomes the same message with ``blob://`` image blocks (a message dict
    becomes a message), written in the background on an event loop (as
    :func:`~speceyes_graph.state.pixel_free`)."""
    if not isinstance(value, dict) or "messages" not in value:
        return value
    sent = value["messages"]
    items = sent if isinstance(sent, list) else [sent]
    background = on_event_loop()
    kept = [_kept_message(item, store, background) for item in items]
    if all(new is old for new, old in zip(kept, items, strict=True)):
        return value
    return {**value, "messages": kept if isinstance(sent, list) else kept[0]}


def _kept_message(item: Any, store: ImageStore, background: bool) -> Any:
    """One message as sent, its pasted images in the store; the item itself when it has
    none, or is not one the store can take (``ask`` and the query then fail on it, with
    their clear errors)."""
    try:
        message = convert_to_messages([item])[0] if isinstance(item, dict) else item
        if not isinstance(message, BaseMessage):
            return item
        kept = dehydrate(message, store, background=background)
    except Exception:
        return item
    return item if kept is message else kept
