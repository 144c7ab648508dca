"""The integrations in front: SpecEyes where LangChain and LangGraph users put it.

- :mod:`.middleware`: :class:`SpecEyesMiddleware` in front of an agent users already have
  (LangChain 1.x ``create_agent``), :class:`ImageStoreMiddleware` (pixels out of state);
  :mod:`.turns`, :mod:`.draft_reply`, :mod:`.store_reading` are its parts.
- :mod:`.chat`: the graph as a chat (any messages UI), :mod:`.compose`: inside a caller
  and as a tool (``speceyes_tool``).
- :mod:`.studio`: the graphs the LangGraph and Aegra servers load, built from the
  environment (``speceyes_graph/serve.py`` is the file their configs name).

May import every part below it (the graph, the agents, the gate, the models) and the demo
(the served example graph); nothing imports it but the CLI and ``serve.py``.
"""

from .chat import create_speceyes_chat_graph
from .compose import speceyes_tool
from .middleware import ImageStoreMiddleware, SpecEyesMiddleware

__all__ = [
    "ImageStoreMiddleware",
    "SpecEyesMiddleware",
    "create_speceyes_chat_graph",
    "speceyes_tool",
]
