"""speceyes-graph: SpecEyes (arXiv 2603.23483) as a LangGraph state graph.

``judge -> speculate -> gate -> (END | agent_loop)``: a large model judges whether a query
needs visual tools; tool-free queries get a batched draft from a small model, kept only if
its answer separability clears a threshold; the rest run the agent. The graph
(:func:`create_speceyes_graph`), a middleware in front of a LangChain agent
(:class:`SpecEyesMiddleware`) and the phases themselves (:mod:`speceyes_graph.phases`) are
three ways to use the same method.
"""

from . import phases
from .agents.loop import LoopOptions, create_agent_loop
from .agents.toolsets import Toolset, ToolsetError, load_toolset, register_tool
from .gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from .gate.separability import (
    GateConfig,
    SeparabilityError,
    acceptance_score,
    answer_separability,
    answer_separability_from_logprobs,
    token_separability,
)
from .graph import SpecEyesError, create_speceyes_graph, parse_judge
from .graph.options import SpeculationOptions
from .integrations.chat import create_speceyes_chat_graph
from .integrations.compose import speceyes_tool
from .integrations.middleware import ImageStoreMiddleware, SpecEyesMiddleware
from .prompts import Prompts
from .settings import Limits
from .state import (
    AgentStep,
    Draft,
    Mode,
    Route,
    SpecEyesContext,
    SpecEyesInput,
    SpecEyesOutput,
    SpecEyesState,
)

__version__ = "0.1.0"


__all__ = [
    "AgentStep",
    "Draft",
    "GateConfig",
    "ImageStoreMiddleware",
    "LabelOptions",
    "Limits",
    "LoopOptions",
    "Mode",
    "OnlineGate",
    "Prompts",
    "RiskOptions",
    "Route",
    "SeparabilityError",
    "SpecEyesContext",
    "SpecEyesError",
    "SpecEyesMiddleware",
    "SpecEyesInput",
    "SpecEyesOutput",
    "SpecEyesState",
    "SpeculationOptions",
    "Toolset",
    "ToolsetError",
    "TrustOptions",
    "acceptance_score",
    "answer_separability",
    "answer_separability_from_logprobs",
    "create_agent_loop",
    "create_speceyes_chat_graph",
    "create_speceyes_graph",
    "load_toolset",
    "parse_judge",
    "phases",
    "register_tool",
    "speceyes_tool",
    "token_separability",
]
