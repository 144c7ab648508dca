"""The typed state of the SpecEyes graph: what goes in, what comes out, what stays inside.

Images travel as *references* (paths, URLs, ``mem://`` keys), never as pixels, so a
checkpointer stores a few bytes per image. The top-level state has no list reducers:
every list is written once by the node that owns it, so embedding the compiled graph in a
parent graph can never apply a list reducer twice. ``timings`` merges dicts, which is
idempotent for the same update.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage
from typing_extensions import Required, TypedDict

__all__ = [
    "AgentStep",
    "Draft",
    "Mode",
    "Route",
    "SpecEyesInput",
    "SpecEyesOutput",
    "SpecEyesState",
    "merge_timings",
]

Mode = Literal["speceyes", "agent", "small"]
"""``speceyes`` (the method), ``agent`` (baseline: every query to the agent loop) and
``small`` (draft only: the speculator's answer is final, the gate score is still recorded)."""

Route = Literal["speculative", "judged-agentic", "rejected-agentic", "agent-only", "draft-only"]
"""Where a query was answered.

- ``speculative``: judged tool-free and the draft passed the gate;
- ``judged-agentic``: the judge said tools help, so the agent loop answered;
- ``rejected-agentic``: judged tool-free, but the draft failed the gate (or had no
  log-probs / errored), so the agent loop answered;
- ``agent-only`` / ``draft-only``: the baseline modes ``agent`` and ``small``.
"""


def merge_timings(
    left: dict[str, float] | None, right: dict[str, float] | None
) -> dict[str, float]:
    """Per-phase wall times merge by key (idempotent: safe if applied twice)."""
    return {**(left or {}), **(right or {})}


class Draft(TypedDict, total=False):
    """The speculator's answer and the evidence the gate used."""

    text: str
    tokens: list[str]
    token_scores: list[float]  # per-token separability S_n
    top_logprobs: list[list[float]]  # sorted top-K log-prob values per token: re-gate offline
    separability: float | None  # the aggregate over tokens (raw, before the sigmoid)
    score: float | None  # the acceptance score compared with tau
    softmax_confidence: float | None  # baseline score, for ablations
    accepted: bool
    error: str | None  # why no score could be computed (then accepted is False)
    note: str | None  # e.g. scored with fewer than K competitors (GateConfig(clamp=True))


class AgentStep(TypedDict, total=False):
    """One model turn of the agent loop and the tool calls it made."""

    step: int
    model_text: str
    model_latency_s: float
    tool_calls: list[dict[str, Any]]  # name, arguments, box (after clamping), latency_s, error
    answer: str | None
    problem: str | None  # a protocol problem that was corrected (malformed JSON, unknown tool...)


class SpecEyesInput(TypedDict, total=False):
    question: Required[str]
    images: list[str]  # references: file paths, file:// / http(s):// / data: URLs, mem:// keys
    options: list[str] | None  # multiple-choice options, shown as A., B., ...
    query_id: str | None


class SpecEyesOutput(TypedDict, total=False):
    answer: str | None
    route: Route | None
    judge_output: str | None
    draft: Draft | None
    agent_messages: list[AnyMessage]
    agent_steps: list[AgentStep]
    stop_reason: str | None  # why the agent loop ended: answered, step_limit, no_tool_call...
    timings: Annotated[dict[str, float], merge_timings]  # seconds per phase
    error: str | None  # set when the query failed; other queries are unaffected


class SpecEyesState(SpecEyesInput, SpecEyesOutput, total=False):
    tool_free: bool | None  # private: the judge's parsed decision
