"""How a SpecEyes graph is configured: its option groups, and the setup they resolve to.

:func:`~speceyes_graph.create_speceyes_graph` takes its settings where they belong:

- the models: ``speculator``, ``agent`` (a chat model, for the built-in loop, or any agent
  that speaks messages), ``judge`` (a chat model, ``"agent"`` or ``"speculator"``);
- ``gate``: phase III (:class:`~speceyes_graph.gate.separability.GateConfig`, an
  :class:`~speceyes_graph.gate.online.OnlineGate`, or a gate file);
- ``speculation``: phases I and II and depth-D speculation (:class:`SpeculationOptions`);
- ``loop``: phase IV, the agent loop (:class:`~speceyes_graph.agents.loop.LoopOptions`);
- ``limits``: deadlines, sizes, per-run ceilings (:class:`~speceyes_graph.settings.Limits`);
- ``tools``, ``prompts``, ``resize``, ``store``, ``mode``, ``on_error``.

:class:`GraphSetup` is everything resolved and checked: the defaults filled in, the
protocol chosen, the modes the models allow. The graph's nodes are built from it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from speceyes_tools.images import ImageStore, ResizeSpec, default_store

from ..agents.loop import LoopOptions, default_max_steps, resolve_protocol
from ..agents.toolsets import Toolset, build_tools, load_toolset
from ..gate.online import OnlineGate
from ..gate.separability import GateConfig
from ..messages import Protocol, bare_model
from ..phases import DRAFT_MAX_TOKENS, JUDGE_MAX_TOKENS
from ..prompts import Prompts
from ..settings import Limits, OnError, RunSettings
from ..state import Mode

log = logging.getLogger(__name__)

__all__ = [
    "THYME_TAU",
    "GraphSetup",
    "SpeculationOptions",
    "Speculation",
    "ToolsSpec",
    "resolve_setup",
]

Speculation = Literal["parallel", "after_judge"]
ToolsSpec = str | Path | Toolset | Sequence[BaseTool]
THYME_TAU = 0.95  # the published threshold of the Thyme runs
_MODES = ("speceyes", "agent", "small", "specreason")


@dataclass(frozen=True)
class SpeculationOptions:
    """Phases I and II (judge and draft) and depth-D speculation.

    ``start``: ``after_judge`` (the paper's funnel: a draft only for queries judged
    tool-free) or ``parallel`` (the draft starts beside the judge; see
    :mod:`speceyes_graph.graph.nodes`). ``judge_max_tokens`` / ``draft_max_tokens``: generation
    lengths, the published 10 and 20 (None: the model's own setting). ``resize``: the small
    model's image frame (default: its own ``resize_spec``, else the agent's frame).

    ``depth`` D > 0: a query the judge sends to the tools first runs the small model's own
    tool loop, at most D tool steps, gated with ``gate.tau_depth``
    (:mod:`speceyes_graph.graph.tool_speculation`); per run: context ``speculation_depth``.
    That loop's ``tools`` (default: the agent's toolset in the small model's frame, or the
    same list), ``prompts`` (default: the agent's) and ``step_tokens`` (each turn's length;
    default: the agent model's ``max_tokens`` when it has one, else the small model's own).
    """

    start: Speculation = "after_judge"
    judge_max_tokens: int | None = JUDGE_MAX_TOKENS
    draft_max_tokens: int | None = DRAFT_MAX_TOKENS
    resize: ResizeSpec | None = None
    depth: int = 0
    tools: ToolsSpec | None = None
    prompts: Prompts | None = None
    step_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.start not in ("parallel", "after_judge"):
            raise ValueError(
                f"speculation must start 'parallel' or 'after_judge', got {self.start!r}"
            )


@dataclass(frozen=True)
class GraphSetup:
    """What a SpecEyes graph is built from: every option resolved and checked."""

    mode: Mode
    judge: Any | None  # phase I's chat model
    speculator: Any | None
    agent: Any | None  # the built-in loop's chat model
    agent_graph: Any | None  # or a user's agent: messages in, messages out
    tools: list[BaseTool]  # the built-in loop's
    small_tools: list[BaseTool]  # the small model's loop's (depth-D speculation)
    protocol: Protocol
    gate: GateConfig
    online: OnlineGate | None
    prompts: Prompts
    loop: LoopOptions  # max_steps resolved
    speculation: SpeculationOptions  # resize and step_tokens resolved
    resize: ResizeSpec  # the agent's (and the judge's) image frame
    judge_resize: ResizeSpec
    limits: Limits
    store: ImageStore
    on_error: OnError
    available: frozenset[str]  # the modes these models allow
    defaults: RunSettings = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "defaults",
            RunSettings(
                tau=self.gate.tau,
                k=self.gate.k,
                aggregation=self.gate.aggregation,
                mode=self.mode,
                max_agent_steps=self.max_steps,
                query_timeout_s=self.limits.query_timeout_s,
                model_timeout_s=self.limits.model_timeout_s,
                tool_timeout_s=self.limits.tool_timeout_s,
                on_error=self.on_error,
                speculation_depth=self.speculation.depth,
                tau_depth=self.gate.tau_depth,
            ),
        )

    @property
    def max_steps(self) -> int:
        steps = self.loop.max_steps
        return default_max_steps(self.protocol) if steps is None else steps

    @property
    def has_fallback(self) -> bool:
        return self.agent is not None or self.agent_graph is not None

    @property
    def parallel(self) -> bool:
        return self.speculation.start == "parallel" and "speceyes" in self.available


def _is_chat_model(model: Any) -> bool:
    """A chat model, or a binding of one (``with_config``, ``bind``)."""
    return isinstance(bare_model(model), BaseChatModel)


def _is_list(tools: Any) -> bool:
    return isinstance(tools, Sequence) and not isinstance(tools, str)


def _tools(tools: ToolsSpec | None, resize: ResizeSpec, store: ImageStore) -> list[BaseTool]:
    """A list of tools as given, or a toolset built for a model's image frame."""
    if tools is None:
        return []
    if _is_list(tools):
        return list(tools)  # type: ignore[arg-type]
    return build_tools(load_toolset(tools), resize=resize, store=store)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Models:
    """The models resolved: the built-in loop's chat model or a user's agent, the judge, and
    the image frame of each."""

    agent: Any | None
    agent_graph: Any | None
    judge: Any | None
    resize: ResizeSpec  # the agent's
    speculator_resize: ResizeSpec
    judge_resize: ResizeSpec

    @property
    def has_agent(self) -> bool:
        return self.agent is not None or self.agent_graph is not None


def _resolve_speculation(
    speculation: SpeculationOptions | Speculation | None,
) -> SpeculationOptions:
    """The speculation group, from just when the draft starts if that is all that is given."""
    if isinstance(speculation, SpeculationOptions):
        return speculation
    return SpeculationOptions(start=speculation or "after_judge")


def _resolve_models(
    speculator: Any | None,
    agent: Any | None,
    judge: Any | None,
    resize: ResizeSpec | None,
    phases: SpeculationOptions,
) -> _Models:
    """The built-in loop's chat model, or a user's agent over messages; the judge; the
    frames."""
    agent_graph = None
    if agent is not None and not _is_chat_model(agent):
        if not callable(getattr(agent, "invoke", None)):
            raise TypeError(
                "agent must be a chat model or an agent that takes messages (a compiled "
                f"graph or Runnable, e.g. create_agent(...)), got {type(agent).__name__}"
            )
        agent, agent_graph = None, agent
    resize = resize or getattr(agent, "resize_spec", None) or ResizeSpec()
    speculator_resize = phases.resize or getattr(speculator, "resize_spec", None) or resize
    if judge == "speculator":
        judge_model, judge_resize = speculator, speculator_resize
    elif judge is None or judge == "agent":
        judge_model, judge_resize = agent, resize
    elif isinstance(judge, str):
        raise ValueError(f"judge must be a chat model, 'agent' or 'speculator', got {judge!r}")
    else:
        judge_model, judge_resize = judge, resize
    return _Models(agent, agent_graph, judge_model, resize, speculator_resize, judge_resize)


def _resolve_tools(
    tools: ToolsSpec | None,
    phases: SpeculationOptions,
    models: _Models,
    can_speculate: bool,
    store: ImageStore,
) -> tuple[list[BaseTool], list[BaseTool]]:
    """The built-in loop's tools in the agent's frame, the small loop's in its own."""
    agent = models.agent
    tool_list = _tools(tools, models.resize, store) if agent is not None else []
    if tool_list:
        _say_unknown_boxes(agent, models.resize)
    small_tools: list[BaseTool] = []
    if can_speculate:
        if phases.tools is not None:
            small_tools = _tools(phases.tools, models.speculator_resize, store)
        elif _is_list(tools) or agent is not None and not isinstance(tools, (str, Path, Toolset)):
            small_tools = tool_list
        else:
            small_tools = _tools(tools, models.speculator_resize, store)
    return tool_list, small_tools


def _say_unknown_boxes(agent: Any, resize: ResizeSpec) -> None:
    """An agent whose family documents no box convention: say what its boxes are read as,
    instead of guessing silently (``ChatTransformersVLM.box_coordinates`` is None)."""
    bare = bare_model(agent)
    if not hasattr(bare, "box_coordinates") or bare.box_coordinates is not None:
        return
    log.warning(
        "%s documents no box convention: the tools read its boxes as they say in their "
        "descriptions (default: pixels of the image as sent, at most %d pixels). If its model "
        "card says otherwise, set the tools' coordinates (a toolset's coordinates = "
        "'thousand' | 'normalized' | 'original' | 'model').",
        getattr(bare, "model", type(bare).__name__),
        resize.max_pixels,
    )


def _resolve_gate(
    gate: GateConfig | OnlineGate | str | Path | None, has_agent: bool, thyme: bool
) -> tuple[GateConfig, OnlineGate | None]:
    """Phase III's gate (loaded from a file, or an online gate's), and the online gate."""
    online = None
    if isinstance(gate, OnlineGate):
        if not has_agent:
            raise ValueError("an online gate learns from the agent's answers: give agent=...")
        online, gate = gate, gate.config
    if isinstance(gate, (str, Path)):
        gate = GateConfig.load(gate)
    return gate or GateConfig(tau=THYME_TAU if thyme else GateConfig().tau), online


def _available_modes(
    speculator: Any | None, models: _Models, can_speculate: bool, protocol: Protocol
) -> set[str]:
    """The modes these models allow."""
    available: set[str] = {"agent"} if models.has_agent else set()
    if speculator is not None:
        available.add("small")
        if can_speculate:
            available.add("speceyes")
        if models.agent is not None and protocol in ("deepeyes", "thyme"):  # text protocols only
            available.add("specreason")
    return available


def _check_mode(
    mode: Mode, speculator: Any | None, models: _Models, available: set[str], protocol: Protocol
) -> None:
    """Raise if ``mode`` needs a model not given, or a protocol these models do not speak."""
    if mode in ("speceyes", "agent", "specreason") and not models.has_agent:
        raise ValueError(f"mode {mode!r} needs an agent (agent=...)")
    if mode in ("speceyes", "small", "specreason") and speculator is None:
        raise ValueError(f"mode {mode!r} needs a speculator model (speculator=...)")
    if mode == "speceyes" and models.judge is None:
        raise ValueError(
            "the agent given is not a chat model, so it cannot judge: give judge=<the large "
            "chat model> (the paper judges with the agent's own model) or judge='speculator'"
        )
    if mode == "specreason" and "specreason" not in available:
        raise ValueError(
            "mode 'specreason' drafts steps of a text protocol (deepeyes or thyme) of the "
            f"built-in loop, not {'a given agent' if models.agent_graph is not None else protocol!r}"
        )


def _check_ranges(
    phases: SpeculationOptions, small_tools: list[BaseTool], max_steps: int, limits: Limits
) -> None:
    """Raise if the speculation depth or the agent's step count is out of range."""
    if not 0 <= phases.depth <= limits.max_speculation_depth:
        raise ValueError(
            f"speculation_depth must be 0..{limits.max_speculation_depth}, got {phases.depth}"
        )
    if phases.depth and not small_tools:
        raise ValueError("depth-D speculation runs the small model's tool loop: give tools=...")
    if not 1 <= max_steps <= limits.max_agent_steps:
        raise ValueError(f"max_agent_steps must be 1..{limits.max_agent_steps}, got {max_steps}")


def resolve_setup(
    *,
    speculator: Any | None,
    agent: Any | None,
    judge: Any | None,
    tools: ToolsSpec | None,
    mode: Mode,
    gate: GateConfig | OnlineGate | str | Path | None,
    speculation: SpeculationOptions | Speculation | None,
    loop: LoopOptions | None,
    prompts: Prompts | None,
    resize: ResizeSpec | None,
    limits: Limits | None,
    store: ImageStore | None,
    on_error: OnError,
) -> GraphSetup:
    """The arguments of :func:`~speceyes_graph.create_speceyes_graph`, resolved and checked."""
    phases, loop = _resolve_speculation(speculation), loop or LoopOptions()
    if mode not in _MODES:
        raise ValueError(f"unknown mode {mode!r}; use 'speceyes', 'agent', 'small' or 'specreason'")
    if on_error not in ("record", "raise"):
        raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
    store = store or default_store()
    limits = limits or Limits()

    models = _resolve_models(speculator, agent, judge, resize, phases)
    can_speculate = speculator is not None and models.judge is not None and models.has_agent
    tool_list, small_tools = _resolve_tools(tools, phases, models, can_speculate, store)
    protocol = resolve_protocol(
        loop.protocol, tool_list if models.agent is not None else small_tools
    )
    thyme = protocol == "thyme"

    gate, online = _resolve_gate(gate, models.has_agent, thyme)
    prompts = prompts or (Prompts.thyme() if thyme else Prompts())
    max_steps = default_max_steps(protocol) if loop.max_steps is None else loop.max_steps
    loop = dataclasses.replace(loop, protocol=protocol, max_steps=max_steps)
    step_tokens = phases.step_tokens or getattr(models.agent, "max_tokens", None)
    phases = dataclasses.replace(
        phases,
        resize=models.speculator_resize,
        step_tokens=step_tokens if isinstance(step_tokens, int) else None,
    )

    available = _available_modes(speculator, models, can_speculate, protocol)
    _check_mode(mode, speculator, models, available, protocol)
    _check_ranges(phases, small_tools, max_steps, limits)
    return GraphSetup(
        mode=mode,
        judge=models.judge,
        speculator=speculator,
        agent=models.agent,
        agent_graph=models.agent_graph,
        tools=tool_list,
        small_tools=small_tools,
        protocol=protocol,
        gate=gate,
        online=online,
        prompts=prompts,
        loop=loop,
        speculation=phases,
        resize=models.resize,
        judge_resize=models.judge_resize,
        limits=limits,
        store=store,
        on_error=on_error,
        available=frozenset(available),
    )
