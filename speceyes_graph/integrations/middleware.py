"""SpecEyes in front of the agent you already have: LangChain 1.x middleware.

::

    from langchain.agents import create_agent
    from speceyes_graph import SpecEyesMiddleware

    agent = create_agent(large, tools, middleware=[SpecEyesMiddleware(speculator=small)])

On the first model call of each human turn, :class:`SpecEyesMiddleware` judges the turn
(with the agent's own model, or a given judge), drafts an answer with the small model and
gates it (:mod:`speceyes_graph.phases`). An accepted draft *is* the agent's reply: an
``AIMessage`` with no tool calls, so the agent ends there and no tool runs; its
``response_metadata["speceyes"]`` says the route, the score and tau. Otherwise the model call
the agent was about to make is made, and the agent's loop runs unchanged. Each turn's record
(route, the judge's verdict, the draft's scores with the gate's evidence, any error; no
model-written text unless ``record_text=True``, so a redaction middleware misses nothing
there) is the state's ``speceyes`` key. A failure of the judge or the draft never fails the
agent: it answers, and the record says why speculation did not.

Images are kept the way the rest of the package keeps them (:class:`ImageStoreMiddleware`,
which :class:`SpecEyesMiddleware` is): a pasted image or a tool's picture is moved into the
image store as it enters the agent's state, so the state and its checkpoints hold
``blob://`` keys, and each model is sent what it can take (a local model the keys, a served
one base64 at its image frame; a tool's images in a user turn after the tool messages, as
OpenAI-compatible servers require). The package's zoom, crop and OCR tools read the turn's
images from the messages, so they work in any such agent.

Where the method's published rules meet an agent, the middleware follows the agent: a turn
without an image, and an agent asked for structured output (``response_format``), are not
speculated on; ``max_agent_steps`` is the agent's own business (LangChain's
``ModelCallLimitMiddleware``).
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple, cast

from cachetools import FIFOCache
from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain.agents.middleware.types import OmitFromInput
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from langgraph.config import get_config
from langgraph.constants import START
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.pregel import Pregel
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired, TypedDict

from speceyes_tools.deadlines import deadline_scope, to_worker_thread
from speceyes_tools.images import ImageStore, default_store, store_scope

from .. import phases
from .._compat import set_input_channel
from ..effects import Blocking, Steps, arun_steps, run_steps
from ..gate.online import OnlineGate
from ..gate.online_steps import OnlineSteps
from ..gate.separability import GateConfig
from ..messages import dehydrate, readable_images, wire_messages
from ..prompts import Prompts
from ..protocol import extract_answer, message_text
from ..query import read_query
from ..settings import Limits
from ..state import Draft, Route, RunInput
from .draft_reply import areplay, replay
from .store_reading import StoreReadingChatModel
from .turns import chat_query, pasted_images_kept

__all__ = [
    "ImageStoreMiddleware",
    "SpecEyesAgentState",
    "SpecEyesMiddleware",
    "SpecEyesTurn",
    "pixel_free_agent",
]


class _Outcome(NamedTuple):
    """A turn's speculation: its record, the accepted reply (or None), the draft's tokens."""

    record: SpecEyesTurn
    reply: AIMessage | None
    tokens: list[str] | None = None


class SpecEyesTurn(TypedDict, total=False):
    """What SpecEyes did with the last human turn."""

    route: Route | None  # speculative, judged-agentic, rejected-agentic; None: not speculated
    judge_output: str | None
    draft: Draft | None  # the draft and the gate's evidence (score, tau, per-token scores)
    error: str | None  # why the turn was not speculated on, or what failed
    gate_key: str | None  # the turn's key in an online gate's ledger
    options: list[str] | None  # the turn's options (an online gate's labels compare with them)
    timings: dict[str, float]


class SpecEyesAgentState(AgentState[Any]):
    """An agent's state with the last turn's SpecEyes record (output only)."""

    speceyes: NotRequired[Annotated[SpecEyesTurn | None, OmitFromInput]]


def pixel_free_agent(agent: Any, store: ImageStore | None = None) -> Any:
    """A compiled agent (``create_agent(...)``, any compiled graph over ``messages``) whose
    record of each run's input holds the image store's keys, not the pasted pixels.

    LangGraph checkpoints a run's input as it was sent (its ``__start__`` channel, kept for
    the thread's life) before any middleware runs. This makes that channel move a pasted
    image into ``store`` as LangGraph takes the input, as the package's own graphs do
    (:class:`~speceyes_graph.state.PixelFreeGraph`); with :class:`ImageStoreMiddleware` (or
    :class:`SpecEyesMiddleware`) in the agent, nothing the thread stores holds pixels. The
    agent is changed in place and returned."""
    store = store or default_store()
    graph = agent.bound if isinstance(agent, RunnableBinding) else agent
    if not isinstance(graph, Pregel) or START not in graph.channels:
        raise TypeError(f"pixel_free_agent takes a compiled graph, got {type(agent).__name__}")
    schema = getattr(getattr(graph, "builder", None), "input_schema", dict)
    set_input_channel(
        graph, RunInput(schema, keep=functools.partial(pasted_images_kept, store=store))
    )
    return agent


class ImageStoreMiddleware(AgentMiddleware[Any, Any]):
    """Images in an agent's messages live in the image store; models get what they take.

    - ``before_agent``: a human message's inline images (base64, ``data:`` URLs) become
      ``blob://`` keys of ``store`` (the message keeps its id, so it replaces itself);
    - ``wrap_tool_call``: a tool's picture becomes a key as it arrives;
    - ``wrap_model_call``: the model is sent the human turns' images at its frame (a model
      with a ``resize_spec``, as :func:`~speceyes_graph.messages.user_message` sends a
      query), tool pictures in a user turn after the tool messages, and base64 unless it
      reads the store itself (``ChatTransformersVLM``);
    - :meth:`readable`: the same view for the model of a middleware placed before this one
      (outside it), which sees the state's keys.

    The agent's state and checkpoints then hold keys, not pixels (LangGraph's own record of
    a run's input still holds what was sent: send keys, or see the deployment guide). With
    several workers give every one the same shared ``store`` (``PostgresBlobs``).
    """

    def __init__(self, store: ImageStore | None = None) -> None:
        super().__init__()
        self.store = store or default_store()

    # --- pictures in ----------------------------------------------------------------------------

    def _kept(self, messages: Sequence[BaseMessage], background: bool) -> list[BaseMessage]:
        """The human messages that change: pixels moved into the store; and in this turn's
        (those since the last AI message) each image the store cannot read replaced by a
        note saying why, so the agent still answers and no later turn trips on it."""
        last_ai = max((i for i, m in enumerate(messages) if isinstance(m, AIMessage)), default=-1)
        kept: list[BaseMessage] = []
        for i, message in enumerate(messages):
            if isinstance(message, HumanMessage):
                new = dehydrate(message, self.store, background=background)
                if i > last_ai:
                    new = readable_images(new, self.store)
                if new is not message:
                    kept.append(new)
        return kept

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        kept = self._kept(state.get("messages") or [], background=False)
        return {"messages": kept} if kept else None

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        kept = await to_worker_thread(self._kept, state.get("messages") or [], False)
        return {"messages": kept} if kept else None

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        result = handler(request)
        return dehydrate(result, self.store) if isinstance(result, ToolMessage) else result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        result = await handler(request)
        if isinstance(result, ToolMessage):
            result = await to_worker_thread(dehydrate, result, self.store)
        return result

    # --- pictures out ---------------------------------------------------------------------------

    def readable(self, model: BaseChatModel) -> StoreReadingChatModel:
        """``model`` sent the pictures of this middleware's store that its messages name by
        key: for a middleware that calls a model of its own and is placed before this one
        (``LLMToolSelectorMiddleware(model=speceyes.readable(ChatOpenAI(...)))``)."""
        return StoreReadingChatModel(model=model, store=self.store)

    def model_request(self, request: ModelRequest) -> ModelRequest:
        """The request with its messages as the model takes them."""
        sent = wire_messages(request.messages, request.model, self.store)
        return request.override(messages=cast(list[AnyMessage], sent))

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> Any:
        with store_scope(self.store):
            return handler(self.model_request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        with store_scope(self.store):
            return await handler(await to_worker_thread(self.model_request, request))


class SpecEyesMiddleware(ImageStoreMiddleware):
    """SpecEyes in front of a LangChain agent (see the module docstring).

    Args:
        speculator: the small model; its replies must carry OpenAI-format top-K log-probs
            (``ChatTransformersVLM(top_logprobs=K)``, ``ChatOpenAI(logprobs=True,
            top_logprobs=K)``).
        judge: the model of phase I; default: the agent's own model (the paper's setup).
        gate: a :class:`~speceyes_graph.gate.separability.GateConfig` (default: the published
            tau 0.98, K 64, ``min``), a gate file from ``speceyes calibrate``, or an
            :class:`~speceyes_graph.gate.online.OnlineGate`: a rejected draft is labelled by
            the agent's answer, a shadowed share of accepted ones by ``shadow``.
        prompts: the judge's and the draft's prompts (default: the published ones).
        judge_max_tokens: the judge's generation length (the published 10).
        draft_max_tokens: the draft's (the published 20).
        limits: each phase's model timeout (``model_timeout_s``), and the question's size
            and image count the turn must keep to (:func:`~speceyes_graph.query.read_query`).
        store: the image store (its policy decides which image URLs may be read).
        shadow: with an online gate, the agent that labels a shadowed accepted draft: any
            agent over messages, run off the user's path on the turn's message (default:
            ``create_agent`` with the agent's model, tools and system prompt).
        record_text: keep the draft's text and tokens and the judge's reply in the turn's
            record (the state's ``speceyes`` key, and so the checkpoints). Off by default:
            a redaction middleware (``PIIMiddleware``) sees the messages, not this record,
            so the record holds no model-written text: the route, the judge's verdict
            (``"yes"``/``"no"``), the draft's scores and the gate's evidence. An accepted
            draft's text is the reply message, where redaction sees it.
    """

    state_schema = SpecEyesAgentState

    def __init__(
        self,
        speculator: BaseChatModel,
        *,
        judge: BaseChatModel | None = None,
        gate: GateConfig | OnlineGate | str | Path | None = None,
        prompts: Prompts | None = None,
        judge_max_tokens: int | None = phases.JUDGE_MAX_TOKENS,
        draft_max_tokens: int | None = phases.DRAFT_MAX_TOKENS,
        limits: Limits | None = None,
        store: ImageStore | None = None,
        shadow: Runnable[Any, Any] | None = None,
        record_text: bool = False,
    ) -> None:
        super().__init__(store)
        self.record_text = record_text
        # each human turn's outcome by its message's id: a retry or fallback middleware
        # around this one calls it again for the same turn, which must not judge and draft
        # again (nor judge with the fallback model); bounded (a turn interrupted for good
        # never comes back for it). An online gate keeps a rejected draft's text until the
        # agent's answer labels it in OnlineSteps, likewise: no checkpoint holds it
        self._turns: FIFOCache[str, _Outcome] = FIFOCache(10_000)
        self._turns_lock = threading.Lock()  # cachetools' caches are not thread-safe
        self.speculator = phases.internal(speculator, "speculator")
        self.judge = judge
        self.online = gate if isinstance(gate, OnlineGate) else None
        config = self.online.config if self.online else gate
        loaded = GateConfig.load(config) if isinstance(config, (str, Path)) else config
        self.gate: GateConfig = loaded if isinstance(loaded, GateConfig) else GateConfig()
        self.prompts = prompts or Prompts()
        self.judge_max_tokens, self.draft_max_tokens = judge_max_tokens, draft_max_tokens
        self.limits = limits or Limits()
        self.shadow_agent = shadow
        self.steps = OnlineSteps(self.online, self._shadow_answer) if self.online else None
        self._default_shadows: dict[tuple[int, ...], Runnable[Any, Any]] = {}

    # --- one turn -------------------------------------------------------------------------------

    def before_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return {**(super().before_agent(state, runtime) or {}), "speceyes": None}

    async def abefore_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return {**(await super().abefore_agent(state, runtime) or {}), "speceyes": None}

    def _turn(self, request: ModelRequest) -> dict[str, Any] | None:
        """The query of this turn's first model call; None on any later call."""
        messages = request.messages
        if request.state.get("speceyes") is not None or not messages:
            return None
        if not isinstance(messages[-1], HumanMessage):
            return None
        return chat_query(messages) or {}

    def _speculate(self, request: ModelRequest, asked: Mapping[str, Any]) -> Steps:
        """Judge, draft, gate: (the turn's record, the accepted reply or None)."""
        t0 = time.perf_counter()
        record: SpecEyesTurn = {"route": None, "judge_output": None, "draft": None, "error": None}
        model = self.judge or request.model
        deadline = time.time() + self.limits.query_timeout_s
        call: dict[str, Any] = {
            "store": self.store,
            "deadline": deadline,
            "timeout": self.limits.model_timeout_s,
        }
        if request.response_format is not None:
            record["error"] = "not speculated: the agent answers in a structured format"
            return _Outcome(record, None)
        try:
            query = yield Blocking(self._read, (asked, model))
        except Exception as exc:
            record["error"] = f"not speculated: {type(exc).__name__}: {exc}"
            return _Outcome(record, None)
        key = self._gate_key()
        record["gate_key"], record["options"] = key, query["options"]
        store = request.runtime.store if request.runtime is not None else None
        try:
            judgement = yield from phases.judge(
                phases.internal(model, "judge"),
                query,
                prompts=self.prompts,
                max_tokens=self.judge_max_tokens,
                **call,
            )
        except Exception as exc:  # the agent answers: the safe default
            record["route"] = "judged-agentic"
            record["error"] = f"judge: {type(exc).__name__}: {exc}"
            return _Outcome(record, None)
        record["judge_output"] = (
            judgement.output if self.record_text else ("yes" if judgement.tools_needed else "no")
        )
        record["timings"] = {"judge": time.perf_counter() - t0}
        if judgement.tools_needed:
            record["route"] = "judged-agentic"
            if self.steps is not None:
                self.steps.judged_agentic(key, _run_config())
            return _Outcome(record, None)
        try:
            reply = yield from phases.draft(
                self.speculator,
                query,
                prompts=self.prompts,
                max_tokens=self.draft_max_tokens,
                **call,
            )
            draft = phases.gate(reply, self.gate)
        except Exception as exc:
            failure = f"speculator: {type(exc).__name__}: {exc}"
            draft = {"text": "", "accepted": False, "error": failure}
        if self.steps is not None:
            turn = {"gate_key": key, "query": query, "request": request}
            self.steps.drafted(key, draft, query, _run_config())
            draft = yield from self.steps.decide(key, turn, draft, store)
        record["draft"] = draft if self.record_text else _without_text(draft)
        record["timings"]["speculate"] = time.perf_counter() - t0
        if not draft.get("accepted"):
            record["route"] = "rejected-agentic"
            return _Outcome(record, None)
        record["route"] = "speculative"
        meta = {"route": "speculative", "score": draft.get("score")}
        meta["tau"] = draft.get("tau", self.gate.tau)
        reply = AIMessage(
            content=draft["text"],
            id=f"speceyes-{uuid.uuid4()}",
            response_metadata={"speceyes": meta},
        )
        return _Outcome(record, reply, draft.get("tokens"))

    def _read(self, asked: Mapping[str, Any], model: Any) -> dict[str, Any]:
        """The turn's query, checked as the graph's intake checks one, its images decoded."""
        if not asked.get("images"):
            raise ValueError("the turn has no image")
        query = read_query(asked, self.store, self.limits, [model, self.speculator])
        for ref in query["images"]:
            self.store.get(ref)  # a broken image fails here, before any model
        return dict(query)

    @staticmethod
    def _gate_key(nonce: str | None = None) -> str:
        """The turn's run key (:meth:`~speceyes_graph.gate.online_steps.OnlineSteps.run_key`):
        the server's run id from the run's config; in process, ``nonce`` (the record's, when
        labelling) or a fresh one."""
        nonce = nonce or uuid.uuid4().hex
        return OnlineSteps.run_key(_run_config(), nonce) or nonce

    @staticmethod
    def _answer(record: SpecEyesTurn, response: ModelResponse) -> ExtendedModelResponse:
        """The model node's result with the turn's record written to the state."""
        return ExtendedModelResponse(
            model_response=response, command=Command(update={"speceyes": record})
        )

    def _seen(self, request: ModelRequest) -> tuple[str | None, Any]:
        """(the turn's id, its outcome if this turn was speculated on already)."""
        turn_id = request.messages[-1].id
        with self._turns_lock:
            return turn_id, self._turns.get(turn_id) if turn_id else None

    def _remember(self, turn_id: str | None, outcome: _Outcome) -> _Outcome:
        if turn_id:
            with self._turns_lock:
                self._turns[turn_id] = outcome
        return outcome

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> Any:
        asked = self._turn(request)
        if asked is None:
            return super().wrap_model_call(request, handler)
        turn_id, seen = self._seen(request)
        record, reply, tokens = seen or self._remember(
            turn_id, run_steps(self._speculate(request, asked))
        )
        if reply is not None:  # the draft is the reply: no model call, no tool
            replay(reply, tokens, request.messages[-1:])
            return self._answer(record, ModelResponse(result=[reply]))
        return self._answer(record, super().wrap_model_call(request, handler))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        asked = self._turn(request)
        if asked is None:
            return await super().awrap_model_call(request, handler)
        turn_id, seen = self._seen(request)
        record, reply, tokens = seen or self._remember(
            turn_id, await arun_steps(self._speculate(request, asked))
        )
        if reply is not None:
            await areplay(reply, tokens, request.messages[-1:])
            return self._answer(record, ModelResponse(result=[reply]))
        return self._answer(record, await super().awrap_model_call(request, handler))

    # --- an online gate's labels ----------------------------------------------------------------

    def _label(self, state: Any, runtime: Runtime[Any]) -> Steps:
        """The agent's answer labels this run's rejected draft: the decision, the draft and
        its options are the ones this process kept for the run (never the state's record,
        which a client can write)."""
        record = state.get("speceyes") or {}
        if self.steps is None or not record.get("gate_key"):
            return
        messages = state.get("messages") or []
        last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        text = message_text(last) if last is not None and not last.tool_calls else ""
        answer = extract_answer(text) or text.strip() or None
        key = self._gate_key(record["gate_key"])
        store = runtime.store if runtime is not None else None
        # an agent that raised never gets here: its turn's draft stays unlabelled
        yield from self.steps.after_agent(
            key, answer, "answered" if answer else "stopped", store=store
        )

    def after_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        run_steps(self._label(state, runtime))
        return None

    async def aafter_agent(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        await arun_steps(self._label(state, runtime))
        return None

    def _shadow_answer(self, turn: Mapping[str, Any], draft: Draft) -> str | None:
        """The agent's answer to a turn whose draft was accepted (in a shadow thread)."""
        request: ModelRequest = turn["request"]
        agent = self.shadow_agent or self._default_shadow(request)
        human = next(m for m in reversed(request.messages) if isinstance(m, HumanMessage))
        config: RunnableConfig = {
            "run_name": "shadow_verification",
            "tags": ["speceyes:shadow"],
            "metadata": {"gate_key": turn.get("gate_key")},
        }
        with deadline_scope(time.time() + self.limits.query_timeout_s):
            out = agent.invoke({"messages": [human]}, config)
        messages = out.get("messages") if isinstance(out, Mapping) else None
        last = (messages or [None])[-1]
        if not isinstance(last, AIMessage) or last.tool_calls:
            raise RuntimeError("the shadow run gave no answer")
        text = message_text(last)
        return extract_answer(text) or text.strip() or None

    def _default_shadow(self, request: ModelRequest) -> Runnable[Any, Any]:
        """``create_agent`` with the agent's model, tools and system prompt (this
        middleware's image handling, no speculation), built once per such agent."""
        from langchain.agents import create_agent

        key = (id(request.model), *map(id, request.tools), hash(request.system_prompt or ""))
        agent = self._default_shadows.get(key)
        if agent is None:
            agent = create_agent(
                request.model,
                list(request.tools),
                system_prompt=request.system_prompt,
                middleware=[ImageStoreMiddleware(self.store)],
            )
            self._default_shadows[key] = agent
        return agent


def _run_config() -> Mapping[str, Any]:
    """The config of the graph run this is called in ({} outside one)."""
    try:
        return get_config()
    except RuntimeError:  # called outside a graph run
        return {}


def _without_text(draft: Draft) -> Draft:
    """A draft as the record keeps it by default: no model-written text (its tokens and
    per-step texts included), its scores and the gate's evidence kept."""
    kept = {k: v for k, v in draft.items() if k not in ("text", "tokens", "steps")}
    return cast(Draft, kept)
