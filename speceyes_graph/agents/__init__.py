"""The agents behind the gate: the built-in tool loop the large model runs (phase IV).

- :mod:`.loop`: :func:`create_agent_loop`, the DeepEyes / Thyme / native tool-calling loop
  as a LangGraph graph (its turns, tool calls, step budget and answer), :class:`LoopOptions`;
  :mod:`.steps` holds its state and the steps it wires (a model turn, routing, correction,
  tool calls, finish).
- :mod:`.toolsets`: the tools a loop calls, declared (:class:`Toolset`, TOML files,
  :func:`register_tool`).

A user's own agent (LangChain's ``create_agent`` or any graph that speaks messages) takes
the loop's place; :mod:`speceyes_graph.graph.fallback` runs either.

May import: the vocabulary modules at the package's top (``state``, ``effects``,
``prompts``, ``protocol``, ``messages``) and ``speceyes_tools``; not the gate, the graph or
the integrations.
"""

from .loop import LoopOptions, create_agent_loop
from .toolsets import Toolset, ToolsetError, load_toolset, register_tool

__all__ = [
    "LoopOptions",
    "Toolset",
    "ToolsetError",
    "create_agent_loop",
    "load_toolset",
    "register_tool",
]
