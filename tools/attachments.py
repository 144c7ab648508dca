"""What a chat client attached to a message, whatever shape its blocks take.

Chat clients send the same picture in many shapes: LangChain Python's standard blocks
(v1 ``base64`` / ``url`` / ``file_id`` with ``mime_type``; v0 ``source_type``), LangChain
JS's (``data`` + ``mimeType``, as agent-chat-ui's uploads are), OpenAI's ``image_url``
(a string, or an object with ``detail``), Anthropic's ``source`` (``base64`` or ``url``),
and ``file`` blocks of any of these whose content is an image. :func:`read_attachment`
reads each into one :class:`Attachment`, through langchain-core's own translation
(``BaseMessage.content_blocks``) where it covers the shape, and the rest here.

An attachment is an image by what its bytes are, not what the block calls them: a
``file`` block holding a PNG is an image, and one holding a PDF is not, whatever its MIME
type says (OpenAI's file shape carries none, and langchain-core then assumes a PDF).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

from langchain_core.messages import HumanMessage

from .codec import read_header
from .formats import identify
from .sources import ImageLoadError

__all__ = ["Attachment", "read_attachment"]

_KINDS = ("image", "image_url", "file")


@dataclass(frozen=True)
class Attachment:
    """One attached image or file, as read from its block.

    ``data`` holds the bytes when they came inline (base64, or a ``data:`` URL),
    ``location`` the URL, ``data:`` URL or ``blob://`` key it was sent as, ``file_id`` a
    provider's file (which no server of ours can read); ``problem`` says why none of them
    could be read."""

    block_type: Literal["image", "image_url", "file"]
    mime_type: str | None = None
    name: str | None = None
    data: bytes | None = None
    location: str | None = None
    file_id: str | None = None
    problem: str | None = None

    @cached_property  # a header read: once per attachment (``label`` asks too)
    def is_image(self) -> bool:
        """Whether it is a picture: by its bytes when it has them, else by what it declares
        (an ``image`` block, or a file with an image MIME type)."""
        if self.data is not None:
            try:
                read_header(self.data)  # Pillow's formats, then the ones it cannot read
            except ImageLoadError:
                signature = identify(self.data)  # an image format this host cannot read
                return signature is not None and not signature.document
            return True
        if self.block_type == "file":
            return (self.mime_type or "").startswith("image/")
        return True

    @property
    def label(self) -> str:
        """How a reply names it to the person: the file name they sent, else its kind."""
        if self.name:
            return self.name
        if self.block_type == "file" and not self.is_image:
            return f"the attached file ({self.mime_type or 'of unknown type'})"
        return "the attached image"


def read_attachment(block: Any) -> Attachment | None:
    """The attachment a content block carries, or None for anything else (text, tool
    calls, a block of another kind)."""
    if not isinstance(block, dict) or block.get("type") not in _KINDS:
        return None
    name = _name(block)
    if block["type"] == "image_url":
        url = block.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return _from_location("image_url", url, None, name)
    source = block.get("source")
    if isinstance(source, dict):  # Anthropic's shape, translated by langchain-core
        block = _translated(block)
    elif block.get("source_type"):  # LangChain v0
        block = _translated(block)
    elif "file" in block and isinstance(block["file"], dict):  # OpenAI's file shape
        block = {**_translated(block), "mime_type": None}  # its "application/pdf" is a guess
    kind: Any = block.get("type") if block.get("type") in _KINDS else "file"
    mime = block.get("mime_type") or block.get("mimeType")
    mime = mime if isinstance(mime, str) else None
    inline = block.get("base64") if block.get("base64") is not None else block.get("data")
    if inline is not None:
        return _from_inline(kind, inline, mime, name)
    if block.get("file_id") or block.get("fileId"):
        return Attachment(kind, mime, name, file_id=str(block.get("file_id") or block["fileId"]))
    return _from_location(kind, block.get("url"), mime, name)


def _translated(block: dict[str, Any]) -> dict[str, Any]:
    """The block in LangChain's v1 standard form, by langchain-core's own translators."""
    try:
        (standard,) = HumanMessage(content=[block]).content_blocks
    except Exception:  # a shape it cannot translate: read as sent
        return block
    if standard.get("type") == "non_standard":
        return block
    return dict(standard)


def _from_inline(kind: Any, data: Any, mime: str | None, name: str | None) -> Attachment:
    if isinstance(data, bytes):
        return Attachment(kind, mime, name, data=data)
    if not isinstance(data, str):
        return Attachment(kind, mime, name, problem=f"its data is a {type(data).__name__}")
    text = "".join(data.split())  # line breaks, as some encoders write them
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        return Attachment(kind, mime, name, problem=f"its data is not base64 ({exc})")
    return Attachment(kind, mime, name, data=raw)


def _from_location(kind: Any, url: Any, mime: str | None, name: str | None) -> Attachment:
    if not isinstance(url, str) or not url:
        return Attachment(kind, mime, name, problem="it holds no image data or URL")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        declared = header[5:].split(";")[0] or mime
        if ";base64" not in header:
            return Attachment(kind, declared, name, problem="its data: URL is not base64")
        inline = _from_inline(kind, payload, declared, name)
        return inline if inline.problem else replace(inline, location=url)
    return Attachment(kind, mime, name, location=url)  # a URL, or a key of the image store


def _name(block: dict[str, Any]) -> str | None:
    """The file name a client sent with the block, wherever its shape keeps it."""
    places = [block.get("metadata"), block.get("extras"), block.get("file"), block]
    for place in places:
        if isinstance(place, dict):
            for key in ("name", "filename", "file_name"):
                value = place.get(key)
                if isinstance(value, str) and value.strip():
                    return value.strip()[:200]
    return None
