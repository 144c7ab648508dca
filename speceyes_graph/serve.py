"""The graphs a server loads by file path (``langgraph.json``, ``aegra.json``).

Each name is a graph factory: ``langgraph dev``, LangGraph Platform and Aegra import this
file at start (once per graph id) and call the factory when a graph is needed, so the start
builds nothing heavy and the models load on first use. The graphs themselves live in
:mod:`speceyes_graph.integrations.studio` (a module, imported once per process), built once
however many graph ids name them, and the same objects every call after the first. Imports
are absolute because the servers load this file by path.
"""

from speceyes_graph.integrations.studio import (
    aserved_graph,
    warn_if_the_online_gate_cannot_be_shared,
)

warn_if_the_online_gate_cannot_be_shared()


async def graph():
    """``speceyes``: question, images, options in; answer, route, evidence out."""
    return await aserved_graph("speceyes")


async def chat_graph():
    """``speceyes_chat``: the same models behind a chat front."""
    return await aserved_graph("speceyes_chat")


async def example_graph():
    """``speceyes_example``: the offline example's scripted models."""
    return await aserved_graph("speceyes_example")


async def online_graph():
    """``speceyes_online``: ``speceyes`` with the online gate."""
    return await aserved_graph("speceyes_online")


async def agent_graph():
    """``speceyes_agent``: LangChain's ``create_agent`` with SpecEyesMiddleware in front."""
    return await aserved_graph("speceyes_agent")


__all__ = ["agent_graph", "chat_graph", "example_graph", "graph", "online_graph"]
