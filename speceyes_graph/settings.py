"""What can change per run, and the limits a deployment puts on it.

A graph is built once with defaults (``create_speceyes_graph(gate=..., mode=...,
max_agent_steps=..., limits=Limits(...))``); each run may override the gate, the mode, the
step bound, the speculation depth and the deadlines through LangGraph's context
(``graph.invoke(x, context={"tau": 0.9})``, an assistant's context on LangGraph Platform,
or ``config["configurable"]`` for older clients). Callers of a served graph are strangers,
so the deployment decides which settings a run may set at all (``Limits.client_settings``:
every one in a graph you run yourself, only :data:`SERVED_CLIENT_SETTINGS` in the served
graphs), a run naming any other fails with a :class:`SettingsError` that says so, and what
may be set is checked and bounded: deadlines can only be shortened, steps stay under the
deployment's ceiling, and nothing about which images may be read can be changed per run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .gate.separability import GateConfig
from .state import Mode

__all__ = [
    "SERVED_CLIENT_SETTINGS",
    "Limits",
    "OnError",
    "RunSettings",
    "SettingsError",
    "resolve_settings",
]

OnError = Literal["record", "raise"]
_MODES = ("speceyes", "agent", "small", "specreason")
_AGGREGATIONS = ("min", "mean", "bottom-q")


class SettingsError(ValueError):
    """A per-run setting is invalid or outside the deployment's limits."""


@dataclass(frozen=True)
class Limits:
    """Deployment limits: deadlines, input sizes and ceilings for per-run overrides.

    Image limits (bytes, pixels, sources, fetch time) belong to the image store's
    :class:`~speceyes_tools.sources.ImagePolicy`.
    """

    query_timeout_s: float = 900.0  # wall clock for a whole query
    model_timeout_s: float = 300.0  # one model call (a 7B agent turn of 1024 tokens fits)
    tool_timeout_s: float = 60.0  # one tool call
    max_question_tokens: int = 4096  # question + options, in the model's own tokens
    context_reserve_tokens: int = 1024  # room left for prompts, image tokens and the reply
    max_images: int = 8
    max_options: int = 26  # labelled A..Z
    max_agent_steps: int = 32  # ceiling for a per-run max_agent_steps
    max_speculation_depth: int = 8  # ceiling for a per-run speculation_depth
    # the RunSettings a run may set through its context, configurable or assistant (None:
    # every one). Anything else a run names is refused, not ignored. Only runs under the
    # deployment's own settings teach an online gate.
    client_settings: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for name in ("query_timeout_s", "model_timeout_s", "tool_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.max_options <= 26:
            raise ValueError(f"max_options must be 1..26 (labels A..Z), got {self.max_options}")
        if self.client_settings is not None:
            object.__setattr__(self, "client_settings", frozenset(self.client_settings))
            unknown = sorted(self.client_settings - set(RunSettings.__dataclass_fields__))
            if unknown:
                raise ValueError(
                    f"client_settings names no setting: {unknown} "
                    f"(settings: {sorted(RunSettings.__dataclass_fields__)})"
                )


@dataclass(frozen=True)
class RunSettings:
    """The settings one run uses (kept in the run's state, so a resumed run keeps them)."""

    tau: float
    k: int
    aggregation: str
    mode: Mode
    max_agent_steps: int
    query_timeout_s: float
    model_timeout_s: float
    tool_timeout_s: float
    on_error: OnError
    speculation_depth: int = 0  # tool steps the small model may take before its gate (0: paper)
    tau_depth: float | None = None  # that gate's threshold (None: tau)

    def gate(self, base: GateConfig) -> GateConfig:
        return base.replace(
            tau=self.tau, k=self.k, aggregation=self.aggregation, tau_depth=self.tau_depth
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def same_run_as(self, other: RunSettings) -> bool:
        """Whether a run under these settings is one under ``other`` in all that decides
        its draft, its gate and its agent (everything but ``on_error``, which only says
        how a failure is reported): the runs whose labels an online gate may learn from."""
        return {**self.as_dict(), "on_error": None} == {**other.as_dict(), "on_error": None}


SERVED_CLIENT_SETTINGS = frozenset({"on_error"})
"""What a client of a served graph may set unless the operator allows more
(``SPECEYES_CLIENT_SETTINGS``): nothing that touches the gate, the models, time or cost."""


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"{name} must be a number, got {value!r:.40}")
    if kind is int:
        if value != int(value):
            raise SettingsError(f"{name} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def resolve_settings(
    overrides: Mapping[str, Any] | None, defaults: RunSettings, limits: Limits
) -> RunSettings:
    """Defaults with this run's overrides applied, checked against the limits. A setting the
    deployment does not let a run set (``limits.client_settings``) is refused."""
    given = {k: v for k, v in (overrides or {}).items() if k in RunSettings.__dataclass_fields__}
    allowed = limits.client_settings
    refused = sorted(
        k for k, v in given.items() if v is not None and allowed is not None and k not in allowed
    )
    if refused:
        raise SettingsError(
            f"this deployment does not let a run set {', '.join(refused)} "
            f"(a run may set: {', '.join(sorted(allowed or ())) or 'nothing'}); its "
            "operator decides that (Limits.client_settings, SPECEYES_CLIENT_SETTINGS)"
        )
    values = {**defaults.as_dict(), **{k: v for k, v in given.items() if v is not None}}
    tau = _number("tau", values["tau"], float)
    if not 0.0 <= tau <= 1.0:
        raise SettingsError(f"tau must be in [0, 1], got {tau}")
    k = _number("k", values["k"], int)
    if k < 2:
        raise SettingsError(f"k must be at least 2, got {k}")
    if values["aggregation"] not in _AGGREGATIONS:
        raise SettingsError(
            f"aggregation must be one of {_AGGREGATIONS}, got {values['aggregation']!r:.40}"
        )
    if values["mode"] not in _MODES:
        raise SettingsError(f"mode must be one of {_MODES}, got {values['mode']!r:.40}")
    if values["on_error"] not in ("record", "raise"):
        raise SettingsError(f"on_error must be 'record' or 'raise', got {values['on_error']!r:.40}")
    steps = _number("max_agent_steps", values["max_agent_steps"], int)
    if not 1 <= steps <= limits.max_agent_steps:
        raise SettingsError(
            f"max_agent_steps must be 1..{limits.max_agent_steps} here, got {steps}"
        )
    depth = _number("speculation_depth", values["speculation_depth"], int)
    if not 0 <= depth <= limits.max_speculation_depth:
        raise SettingsError(
            f"speculation_depth must be 0..{limits.max_speculation_depth} here, got {depth}"
        )
    tau_depth = values["tau_depth"]
    if tau_depth is not None:
        tau_depth = _number("tau_depth", tau_depth, float)
        if not 0.0 <= tau_depth <= 1.0:
            raise SettingsError(f"tau_depth must be in [0, 1], got {tau_depth}")
    timeouts = {}
    for name in ("query_timeout_s", "model_timeout_s", "tool_timeout_s"):
        value = _number(name, values[name], float)
        if not value > 0:
            raise SettingsError(f"{name} must be positive, got {value}")
        timeouts[name] = min(value, getattr(limits, name))  # a run may only shorten deadlines
    return RunSettings(
        tau=tau,
        k=k,
        aggregation=values["aggregation"],
        mode=values["mode"],
        max_agent_steps=steps,
        on_error=values["on_error"],
        speculation_depth=depth,
        tau_depth=tau_depth,
        **timeouts,
    )


def run_overrides(context: Any, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-run values from LangGraph's context (preferred) or ``config["configurable"]``."""
    merged: dict[str, Any] = {}
    configurable = (config or {}).get("configurable") or {}
    if isinstance(configurable, Mapping):
        merged.update(
            {k: v for k, v in configurable.items() if k in RunSettings.__dataclass_fields__}
        )
    if isinstance(context, Mapping):
        merged.update(context)
    elif context is not None:  # a dataclass or pydantic context object
        merged.update(
            {
                k: getattr(context, k)
                for k in RunSettings.__dataclass_fields__
                if hasattr(context, k)
            }
        )
    return merged
