"""The typed state of the SpecEyes graph: what goes in, what comes out, what stays inside.

**Every run starts clean, and a run redelivered after its worker died still has its
input.** The input keys are :class:`RunInput` channels: kept in the checkpoints taken before
the first node (``intake``) has read them, so a run taken over by another worker with the
same ``run_id`` (LangGraph then resumes from the last checkpoint and ignores the input it is
sent again) reads the same input; cleared in the step ``intake`` runs, so a later run on the
thread that omits a key cannot inherit it. ``intake`` validates them into ``query`` and
resets every output key, so a run never returns an earlier run's answer, route, steps or
error. A ``data:`` URL is never written to a checkpoint: it is moved into the graph's image
store as LangGraph takes the input (:class:`PixelFreeGraph`), so LangGraph's record of the
input, the writes that spread it over the input keys and the ``images`` channel all hold the
``blob://`` key of its bytes.

**No pixels in state.** Images travel as references (paths, URLs, ``blob://`` keys of the
image store); the agent's messages carry ``blob://`` image blocks that become bytes only
when a model is called. A checkpoint stores a few bytes per image.

**No list reducers at the top level.** Every list is written once by the node that owns it,
so embedding the compiled graph in a parent graph can never apply a list reducer twice.
``timings`` merges dicts (idempotent) and is reset by ``intake`` with ``Overwrite``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage
from langgraph.channels import EphemeralValue
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.typing import ContextT, InputT, OutputT, StateT
from pydantic import Field
from typing_extensions import Required, Self, TypedDict

from speceyes_tools.images import ImageStore, current_store
from speceyes_tools.sources import read_data_url

from ._compat import NO_VALUE, set_input_channel

__all__ = [
    "AgentStep",
    "Draft",
    "Mode",
    "PixelFreeGraph",
    "Query",
    "Route",
    "RunInput",
    "SpecEyesContext",
    "SpecEyesInput",
    "SpecEyesOutput",
    "SpecEyesState",
    "merge_timings",
]

Mode = Literal["speceyes", "agent", "small", "specreason"]
"""``speceyes`` (the method), ``agent`` (baseline: every query to the agent loop),
``small`` (draft only: the speculator's answer is final, the gate score is still recorded)
and ``specreason`` (the SpecReason baseline: the small model drafts each step of the agent's
reasoning, the large model scores it; see :mod:`speceyes_graph.graph.specreason`)."""

Route = Literal[
    "speculative",
    "speculative-tools",
    "judged-agentic",
    "rejected-agentic",
    "agent-only",
    "draft-only",
    "specreason",
]
"""Where a query was answered.

- ``speculative``: judged tool-free and the draft passed the gate;
- ``speculative-tools``: the judge said tools help, and with ``speculation_depth`` D > 0 the
  small model's own tool loop (at most D tool steps) answered and passed its gate
  (``tau_depth``); the answer and its evidence are in ``tool_draft``;
- ``judged-agentic``: the judge said tools help, so the agent loop answered (with D > 0:
  after the small model's tool loop was rejected or failed; ``tool_draft`` says why);
- ``rejected-agentic``: judged tool-free, but the draft failed the gate (or had no
  log-probs / errored), so the agent loop answered;
- ``agent-only`` / ``draft-only`` / ``specreason``: the baseline modes ``agent``,
  ``small`` and ``specreason``.
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
    discarded: bool  # drafted beside the judge, which then asked for tools (note says how)
    batch_size: int  # requests in the speculator's generate call (local models report it)
    # an online gate (OnlineGate): the tau this draft met, whether it was shadow-verified,
    # when it was gated (time.time()), and the gate's estimated risk at that tau then, with
    # its upper bound (None while the gate warms up)
    tau: float
    shadowed: bool
    gated_at: float
    gate_risk: float | None
    gate_risk_bound: float | None
    # where the online gate's labels live: "shared" by every worker through the store, or
    # kept to this "process" (no store, or no SPECEYES_GATE_KEY to sign a shared one's)
    gate_scope: Literal["shared", "process"]
    gate_counts: dict[str, int]  # what its tau rests on: window, labelled, disagreeing
    # depth-D speculation (``tool_draft``): the small model's tool loop before the answer
    depth: int  # the tool steps it was allowed (speculation_depth)
    steps: list[AgentStep]  # its turns: model text, tool calls with boxes, latencies
    stop_reason: str | None  # why its loop ended (answered, step_limit, error, ...)
    latency_s: float  # wall time of the whole small loop, gate included


class AgentStep(TypedDict, total=False):
    """One model turn of the agent loop and the tool calls it made."""

    step: int
    model_text: str
    model_latency_s: float
    tool_calls: list[dict[str, Any]]  # name, arguments, box (after clamping), latency_s, error
    answer: str | None
    problem: str | None  # a protocol problem that was corrected (malformed JSON, unknown tool...)
    # SpecReason steps: the small model's draft, the large model's 0-9 score, and whether the
    # draft was kept (model_text is then the draft; else the large model's own step)
    drafted: str
    score: int
    accepted: bool


class Query(TypedDict):
    """A validated query, as ``intake`` writes it: what every later node reads."""

    question: str
    images: list[str]  # stable references: resolved paths or blob:// keys
    options: list[str] | None
    query_id: str | None


UNREADABLE = "unreadable:"
"""What a kept input reference starts with when its image could not be kept; the reason
follows, and ``intake`` fails the query with it."""


class RunInput(EphemeralValue[Any]):
    """An input key of one run: in the checkpoints until the step that reads it, then gone.

    LangGraph clears an ephemeral channel in the first step that does not write it, which
    for an input key is the step ``intake`` runs in; until then its value is checkpointed.
    ``keep`` turns each value written into what a checkpoint may hold (for ``images``: the
    ``blob://`` key of a ``data:`` URL's bytes) as it is written, so the raw value is never
    the channel's. A run that stopped before ``intake`` and is never taken over leaves its
    input in that checkpoint; the next run on the thread starts by discarding the unfinished
    step, which clears the keys it does not send.

    LangGraph's own record of a run's input, its ``__start__`` channel, is one too in the
    graphs of :class:`PixelFreeGraph`.
    """

    __slots__ = ("keep",)

    def __init__(self, typ: Any, keep: Callable[[Any], Any] | None = None) -> None:
        super().__init__(typ, guard=False)
        self.keep = keep

    def __eq__(self, value: object) -> bool:
        return isinstance(value, RunInput)

    def copy(self) -> Self:
        copied = self.__class__(self.typ, self.keep)
        copied.key, copied.value = self.key, self.value
        return copied

    def from_checkpoint(self, checkpoint: Any) -> Self:
        restored = self.__class__(self.typ, self.keep)
        restored.key = self.key
        if checkpoint is not NO_VALUE:
            restored.value = checkpoint
        return restored

    def update(self, values: Sequence[Any]) -> bool:
        last = values[-1:]  # the last of several writes, like guard=False
        if last and self.keep is not None:
            last = [self.keep(last[0])]
        return super().update(last)


class PixelFreeGraph(StateGraph[StateT, ContextT, InputT, OutputT]):
    """A ``StateGraph`` whose compiled graphs keep pasted images out of LangGraph's record
    of each run's input.

    LangGraph writes a run's input as sent into its ``__start__`` channel, checkpoints it
    (the "input" checkpoint, kept for the thread's life: it is how a run is resumed or
    replayed) and saves the writes that spread it over the input keys. ``keep_input`` is
    applied to the input as the channel takes it, before any of that: the served graphs
    move each pasted ``data:`` image into the image store there, so every checkpoint and
    every saved write holds its ``blob://`` key, and a run taken over by another worker
    reads the same input from them. It runs once per run, on the thread that starts the
    run (the event loop, for ``ainvoke``), and must not raise: a value it cannot keep it
    replaces by a marker that fails the query at ``intake``.
    """

    keep_input: Callable[[Any], Any] | None = None

    def compile(
        self, *args: Any, **kwargs: Any
    ) -> CompiledStateGraph[StateT, ContextT, InputT, OutputT]:
        compiled = super().compile(*args, **kwargs)
        if self.keep_input is not None:
            set_input_channel(compiled, RunInput(self.input_schema, keep=self.keep_input))
        return compiled


def pixel_free(refs: Any, store: ImageStore | None = None) -> Any:
    """Image references as a checkpoint may hold them: each ``data:`` URL kept in ``store``
    (default: :func:`~speceyes_tools.images.current_store`) and replaced by its ``blob://``
    key; other references as they are. A ``data:`` URL the store refuses is replaced by a
    marker that fails ``intake`` with the store's reason.

    On an event loop (LangGraph taking the input of an ``ainvoke`` or a served run) the bytes
    are written in the background (``ImageStore.put(background=True)``): only decoding the
    URL and hashing its bytes run on the loop, and ``intake`` waits for the write."""
    one = isinstance(refs, str)
    items = [refs] if one else refs
    if not isinstance(items, list):
        return refs
    kept = []
    for ref in items:
        if isinstance(ref, str) and ref[:5].lower() == "data:":
            try:
                store = store or current_store()
                ref = store.put(read_data_url(ref, store.policy), background=on_event_loop())
            except Exception as exc:  # the run fails at intake either way
                ref = f"{UNREADABLE}{type(exc).__name__}: {exc}"[:500]
        kept.append(ref)
    return kept[0] if one else kept


def on_event_loop() -> bool:
    """Whether this thread is running an asyncio event loop (where I/O must not wait)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def pixel_free_input(value: Any, store: ImageStore | None = None) -> Any:
    """A run's input (``SpecEyesInput``) with its ``images`` made :func:`pixel_free`."""
    if isinstance(value, dict) and "images" in value:
        return {**value, "images": pixel_free(value["images"], store)}
    return value


class SpecEyesInput(TypedDict, total=False):
    """One visual question. Send the image itself (``data:`` URL) or a reference to it."""

    question: Required[
        Annotated[
            str,
            RunInput(str),
            Field(description="The question about the image(s), in plain text."),
        ]
    ]
    images: Annotated[
        list[str],
        RunInput(list, keep=pixel_free),
        Field(
            description=(
                "The query's images, as a list of references: 'data:image/png;base64,...' "
                "URLs, https:// URLs, or (where the deployment allows) local paths and "
                "http:// URLs. Served graphs accept data: and public https URLs by default."
            )
        ),
    ]
    options: Annotated[
        list[str] | None,
        RunInput(list),
        Field(
            description="Multiple-choice options (at most 26), shown to the models as A., B., ...; "
            "omit for open questions."
        ),
    ]
    query_id: Annotated[
        str | None,
        RunInput(str),
        Field(
            description="Your identifier for this query (kept in the run's state as query.query_id)."
        ),
    ]


class SpecEyesOutput(TypedDict, total=False):
    """The answer, where it came from, and the evidence."""

    answer: Annotated[str | None, Field(description="The final answer (None if the query failed).")]
    route: Annotated[
        Route | None,
        Field(
            description="speculative (small model, gate accepted), speculative-tools (the small "
            "model's own tool loop answered, gate accepted), judged-agentic (the judge asked for "
            "tools), rejected-agentic (the gate rejected the draft), agent-only or draft-only "
            "(baseline modes)."
        ),
    ]
    judge_output: Annotated[
        str | None, Field(description="What the large model answered to 'would tools help?'.")
    ]
    draft: Annotated[
        Draft | None,
        Field(
            description="The small model's answer with its separability score and top-K log-probs."
        ),
    ]
    tool_draft: Annotated[
        Draft | None,
        Field(
            description="Depth-D speculation: the small model's answer after its own tool steps, "
            "with those steps and the answer's separability score (None at depth 0)."
        ),
    ]
    agent_messages: Annotated[
        list[AnyMessage],
        Field(description="The agent loop's transcript (images as blob:// references)."),
    ]
    agent_steps: Annotated[
        list[AgentStep],
        Field(description="Every agent turn: model text, tool calls, boxes, latencies."),
    ]
    stop_reason: Annotated[
        str | None,
        Field(description="Why the agent loop ended: answered, step_limit, deadline, error, ..."),
    ]
    timings: Annotated[  # the reducer must be the last annotation (LangGraph reads meta[-1])
        dict[str, float],
        Field(description="Wall time per phase, in seconds."),
        merge_timings,
    ]
    error: Annotated[
        str | None, Field(description="Why the query failed; None when it was answered.")
    ]


class SpecEyesState(SpecEyesInput, SpecEyesOutput, total=False):
    query: Query  # the validated input (checkpointed; the raw input only until intake)
    settings: dict[str, Any]  # this run's resolved settings (see settings.RunSettings)
    deadline: float  # this query's absolute deadline, time.time() seconds
    pending_draft: str | None  # ticket of a draft started beside the judge (parallel speculation)
    gate_key: str | None  # this query's key in the online gate's ledger (None: not gated online)


class SpecEyesContext(TypedDict, total=False):
    """Per-run settings (``graph.invoke(..., context={...})``, or a LangGraph assistant's
    context). Unset keys keep the graph's defaults; a run may set only those the
    deployment allows (``Limits.client_settings``; a served graph: ``on_error`` unless its
    operator allows more), and deadlines and steps are capped by its
    :class:`~speceyes_graph.settings.Limits`."""

    tau: Annotated[
        float,
        Field(
            description="Gate threshold in [0, 1]; a draft is accepted when sigmoid(0.6*S) > tau.",
            ge=0,
            le=1,
        ),
    ]
    k: Annotated[
        int, Field(description="Top-K logits per token used by the separability score.", ge=2)
    ]
    aggregation: Annotated[
        Literal["min", "mean", "bottom-q"],
        Field(description="How token scores combine into the answer's score (min is published)."),
    ]
    mode: Annotated[
        Mode,
        Field(
            description="speceyes (the method), agent (every query to the tool loop), small (draft "
            "only), specreason (the SpecReason baseline: drafted and scored reasoning steps)."
        ),
    ]
    max_agent_steps: Annotated[
        int, Field(description="Model turns allowed in the agent loop.", ge=1)
    ]
    speculation_depth: Annotated[
        int,
        Field(
            description="Tool steps the small model may take on a query the judge sends to the "
            "tools before its answer is gated (0: the paper's tool-free speculation only).",
            ge=0,
        ),
    ]
    tau_depth: Annotated[
        float,
        Field(
            description="Gate threshold for the small model's answer after its tool steps.",
            ge=0,
            le=1,
        ),
    ]
    query_timeout_s: Annotated[
        float, Field(description="Wall-clock deadline for the whole query.", gt=0)
    ]
    model_timeout_s: Annotated[float, Field(description="Deadline for each model call.", gt=0)]
    on_error: Annotated[
        Literal["record", "raise"],
        Field(description="record: a failed query returns with 'error' set; raise: the run fails."),
    ]
