"""``ServedChatModel``: ``ChatOpenAI`` that also says what the graph asks of a local model.

Kept apart from :mod:`.openai_compat` because it imports langchain-openai (an extra) at once.
"""

from __future__ import annotations

from langchain_openai import ChatOpenAI
from pydantic import ConfigDict

from speceyes_tools.geometry import Coordinates
from speceyes_tools.images import ResizeSpec

__all__ = ["ServedChatModel"]


class ServedChatModel(ChatOpenAI):
    """A served vision-language model: a ``ChatOpenAI`` client plus what its server told us
    (:func:`~speceyes_graph.models.openai_chat_model` fills these in)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    resize_spec: ResizeSpec | None = None
    """How the server's processor resizes images: the frame of the model's boxes."""
    context_length: int | None = None
    """The server's ``max_model_len``: what a question must fit into."""
    served_root: str | None = None
    """The checkpoint the server reports having loaded (a hub id or a folder)."""
    box_coordinates: Coordinates | None = None
    """How the model writes boxes, where its family documents it (None: unknown)."""

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """No: LangChain's loader knows ``ChatOpenAI``, not this class; build it again with
        :func:`~speceyes_graph.models.openai_chat_model`, which asks the server anew."""
        return False
