"""The SpecEyes phases as building blocks: judge, draft, gate.

- :func:`judge` (phase I): the large model answers "would tools significantly improve
  answer reliability?"; a :class:`Judgement` says whether the query needs tools.
- :func:`draft` (phase II): the small model answers the query tool-free, with the top-K
  log-probs of every token it wrote.
- :func:`gate` (phase III): the draft's answer separability against tau; the
  :class:`~speceyes_graph.state.Draft` it returns says whether the answer is kept.

Each takes a query (``question``, ``images``, ``options``), not a graph's state, so the
graph's nodes (:mod:`speceyes_graph.graph.nodes`), the middleware in front of a LangChain agent
(:class:`~speceyes_graph.integrations.middleware.SpecEyesMiddleware`) and the online gate's part of a run
(:mod:`speceyes_graph.gate.online_steps`, which gates what :func:`gate` scored) share one
implementation of the method, and a user's own graph can call the same.

Why one module of three functions rather than a module per phase: each phase is a prompt,
one model call and a reading of the reply, and all three share the call (:func:`ask`: the
deadline, the image store, the effects) and the prompts. Apart, each would be a screen of
imports around twenty lines.

:func:`judge` and :func:`draft` call a model, so they are *steps*
(:mod:`speceyes_graph.effects`): a graph node writes ``reply = yield from draft(...)``, other
code drives them with :func:`~speceyes_graph.effects.run_steps` or
``await arun_steps(...)``; the same body runs under ``invoke`` and ``ainvoke``::

    from speceyes_graph.effects import run_steps
    from speceyes_graph.phases import draft, gate, judge

    query = {"question": "What colour is the car?", "images": ["blob://..."], "options": None}
    if not run_steps(judge(large, query)).tools_needed:
        kept = gate(run_steps(draft(small, query)), GateConfig())
        print(kept["text"] if kept["accepted"] else "ask the agent")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage
from langgraph.constants import TAG_NOSTREAM

from speceyes_tools.deadlines import check_deadline, deadline_scope
from speceyes_tools.images import ImageStore, ResizeSpec, default_store, store_scope

from .effects import Blocking, ModelCall, Steps
from .gate.separability import GateConfig
from .messages import accepts_image_refs, bare_model, for_model, user_message
from .prompts import Prompts
from .protocol import message_text, parse_judge
from .state import Draft

__all__ = [
    "JUDGE_MAX_TOKENS",
    "DRAFT_MAX_TOKENS",
    "Judgement",
    "announce",
    "ask",
    "draft",
    "draft_messages",
    "gate",
    "handles_deadlines",
    "internal",
    "judge",
    "judge_messages",
    "score_draft",
]

log = logging.getLogger(__name__)

JUDGE_MAX_TOKENS = 10  # the published generation lengths
DRAFT_MAX_TOKENS = 20


@dataclass(frozen=True)
class Judgement:
    """What the judge said: ``tools_needed`` by the published rule (anything but an answer
    starting with "no" sends the query to the tools: the safe default), and its ``output``."""

    tools_needed: bool
    output: str


def internal(model: Any, name: str) -> Any:
    """A model for a phase's calls: hidden from ``stream_mode="messages"`` (a caller streams
    answers, not the judge's "yes" or a draft) and named ``name`` in traces."""
    return None if model is None else model.with_config(tags=[TAG_NOSTREAM], run_name=name)


def handles_deadlines(model: Any) -> bool:
    """Whether a model (or a binding of one) honours the deadline context itself."""
    return bool(getattr(bare_model(model), "handles_deadlines", False))


def announce(model: Any, n: int = 1, **kwargs: Any) -> bool:
    """Tell a model's batch worker that ``n`` calls with these settings are coming (``n=-1``:
    one will not), so it does not launch a part-full batch meanwhile; False when the model
    takes no announcements (``ChatTransformersVLM`` does)."""
    tell = getattr(bare_model(model), "announce", None)
    if not callable(tell):
        return False
    tell(n, **kwargs)
    return True


def ask(
    model: Any,
    messages: Callable[[], list[BaseMessage]],
    what: str,
    *,
    store: ImageStore,
    timeout: float | None = None,
    deadline: float | None = None,
    inline: bool | None = None,
    ready: Callable[[], bool] | None = None,
    **kwargs: Any,
) -> Steps:
    """One model call within ``timeout`` and the query's ``deadline`` (absolute,
    ``time.time()``): the messages are built (images resized, read, encoded) off the event
    loop, then the call is made. ``inline``: the model bounds its own waits
    (:func:`handles_deadlines`; looked up when None). ``ready``: says when building the
    messages is only lookups (then it runs in place, on the event loop). ``kwargs`` go to
    the model (``max_tokens``, ``announced``)."""
    if inline is None:
        inline = handles_deadlines(model)
    with deadline_scope(deadline), store_scope(store):
        check_deadline(what)
        wire = yield Blocking(lambda: for_model(messages(), model, store), ready=ready)
        return (yield ModelCall(model, wire, what, timeout=timeout, inline=inline, kwargs=kwargs))


def _views_ready(
    model: Any, query: Mapping[str, Any], frame: ResizeSpec, store: ImageStore
) -> Callable[[], bool]:
    """Whether a prompt over the query's images is only lookups: a model that takes image
    references, and every image already resized to its frame (a second question on an
    image, an agent turn, a retried query)."""
    return lambda: accepts_image_refs(model) and store.has_views(query.get("images") or (), frame)


def _frame(model: Any, resize: ResizeSpec | None) -> ResizeSpec:
    return resize or getattr(bare_model(model), "resize_spec", None) or ResizeSpec()


def judge_messages(
    query: Mapping[str, Any], prompts: Prompts, resize: ResizeSpec, store: ImageStore
) -> list[BaseMessage]:
    """Phase I's prompt: the published system prompt, then the images and the question with
    "Would tools significantly improve answer reliability? yes or no."."""
    text = prompts.question(query["question"], query.get("options")) + prompts.judge_suffix
    image_and_text = user_message(query.get("images"), text, resize, store)
    return [SystemMessage(content=prompts.judge_system), image_and_text]


def draft_messages(
    query: Mapping[str, Any], prompts: Prompts, resize: ResizeSpec, store: ImageStore
) -> list[BaseMessage]:
    """Phase II's prompt: "Output only the final answer itself", the images, the question
    and "Answer:"."""
    text = prompts.question(query["question"], query.get("options")) + prompts.speculator_suffix
    image_and_text = user_message(query.get("images"), text, resize, store)
    return [SystemMessage(content=prompts.speculator_system), image_and_text]


def judge(
    model: Any,
    query: Mapping[str, Any],
    *,
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
    max_tokens: int | None = JUDGE_MAX_TOKENS,
    **call: Any,
) -> Steps:
    """Phase I: does the query need tools? (``judgement = yield from judge(...)``)

    ``model``: the large model (the paper's setup; any chat model works); ``resize``: its
    image frame (default: the model's ``resize_spec``, else Qwen2.5-VL's); ``max_tokens``:
    the published 10 (None: the model's own setting); ``call``: :func:`ask`'s ``timeout``,
    ``deadline``, ``inline`` and model keywords. A failed call raises; the caller decides
    (the graph fails the query, the middleware lets the agent answer)."""
    store = store or default_store()
    prompts = prompts or Prompts()
    frame = _frame(model, resize)
    if max_tokens:
        call["max_tokens"] = max_tokens
    reply = yield from ask(
        model,
        lambda: judge_messages(query, prompts, frame, store),
        "judge",
        store=store,
        ready=_views_ready(model, query, frame, store),
        **call,
    )
    output = message_text(reply).strip()
    return Judgement(tools_needed=not parse_judge(output), output=output)


def draft(
    model: Any,
    query: Mapping[str, Any],
    *,
    prompts: Prompts | None = None,
    resize: ResizeSpec | None = None,
    store: ImageStore | None = None,
    max_tokens: int | None = DRAFT_MAX_TOKENS,
    **call: Any,
) -> Steps:
    """Phase II: the small model's tool-free answer (``reply = yield from draft(...)``).

    ``model`` must return OpenAI-format top-K log-probs in ``response_metadata["logprobs"]``
    (``ChatTransformersVLM(top_logprobs=K)``, ``ChatOpenAI(logprobs=True, top_logprobs=K)``)
    for :func:`gate` to score; the rest as :func:`judge` (``max_tokens``: the published 20)."""
    store = store or default_store()
    prompts = prompts or Prompts()
    frame = _frame(model, resize)
    if max_tokens:
        call["max_tokens"] = max_tokens
    return (
        yield from ask(
            model,
            lambda: draft_messages(query, prompts, frame, store),
            "speculator",
            store=store,
            ready=_views_ready(model, query, frame, store),
            **call,
        )
    )


def score_draft(reply: Any, config: GateConfig) -> Draft:
    """The gate's fields for a draft reply (score, per-token evidence, ``accepted``); a draft
    that cannot be scored is rejected, with why.

    Log-probs come from a model or a server and are untrusted: any malformed shape becomes
    a recorded rejection, never an exception."""
    logprobs = (getattr(reply, "response_metadata", None) or {}).get("logprobs")
    if not logprobs:
        log.warning(
            "speculator reply has no logprobs; the draft is rejected (request top_logprobs=K)"
        )
    return config.decide(logprobs)


def gate(reply: Any, config: GateConfig) -> Draft:
    """Phase III: the draft (its text, answer separability and evidence) and whether it
    clears ``config.tau``: ``sigmoid(0.6 * min_n S_n) > tau`` with the published settings.

    An empty draft is rejected whatever its score; a local model's ``batch_size`` (requests
    in its ``generate`` call) is kept for the throughput report."""
    kept: Draft = {"text": message_text(reply).strip(), **score_draft(reply, config)}
    batch_size = (getattr(reply, "response_metadata", None) or {}).get("batch_size")
    if isinstance(batch_size, int):
        kept["batch_size"] = batch_size
    if not kept["text"]:
        kept.update({"accepted": False, "error": kept.get("error") or "the draft is empty"})
    return kept
