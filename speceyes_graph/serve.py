"""The graphs a server loads by file path (``langgraph.json``, ``aegra.json``).

``langgraph dev``, LangGraph Platform and Aegra execute the file a graph id names once per
graph id. This file only imports the graphs from :mod:`speceyes_graph.integrations.studio` (a module,
imported once per process), so the models behind them are built once however many graph
ids name it; naming ``studio.py`` itself would build them once per graph id.
"""

from speceyes_graph.integrations.studio import (
    agent_graph,
    chat_graph,
    example_graph,
    graph,
    online_graph,
)

__all__ = ["agent_graph", "chat_graph", "example_graph", "graph", "online_graph"]
