"""SpecEyes as a chat: messages in, the answer (and the agent's zooms) appended as messages.

The last human message is the query (:func:`~speceyes_graph.integrations.turns.chat_query`):
its text is the question, an ``Options:`` line starts the multiple-choice options, and its
images, in any shape a chat client sends them (:mod:`speceyes_tools.attachments`), are the
images; a follow-up without an image asks about the latest image of the conversation.

What a person sees in a stock chat UI, and why:

- **their images**, as a thumbnail of a few KB kept in their message (the JS block
  ``data`` + ``mimeType`` that agent-chat-ui renders), whose metadata names the stored
  image (what every model is sent) and, on a server, the URL that serves it; the image
  itself stays in the image store, never in state or checkpoints;
- **the agent's zooms**, as the AI tool-call messages and tool messages chat UIs render (and
  hide when asked), each tool message's ``artifact`` holding the crop the model looked at;
- **an answer**, never protocol tags: an answer that matches no option says so, and the
  model's own text stays in the turn's ``draft``/``agent_steps`` and the reply's metadata;
- **a reply on every turn**: a turn without an image, with a file that is not one, or with
  an image that cannot be read is answered at once, without a model call, saying what was
  received and what to send; a turn that fails says which image and why, and the thread
  goes on.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import quote
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import set_config_context
from langgraph.errors import GraphBubbleUp
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages, push_message
from typing_extensions import TypedDict

from speceyes_tools.codec import thumbnail
from speceyes_tools.images import ImageStore, default_store
from speceyes_tools.sources import ImageLoadError

from .._compat import PUSHED_MESSAGES_KEEP_THE_GRAPH
from ..answers import extract_choice
from ..effects import Blocking, Steps, node, router
from ..graph.build import create_speceyes_graph
from ..messages import (
    NOT_READ,
    STORED,
    UNREADABLE_NOTE,
    block_metadata,
    cannot_read,
    dehydrate,
    image_ref,
    is_unreadable,
    readable_images,
    unreadable,
)
from ..protocol import extract_answer, message_text
from ..state import AgentStep, Draft, PixelFreeGraph, Route, SpecEyesContext
from .compose import gate_score, run_unstreamed
from .turns import chat_query, pasted_images_kept

__all__ = ["SpecEyesChatState", "chat_reply", "create_speceyes_chat_graph"]

THUMBNAIL_SIDE = 64  # px: agent-chat-ui shows 16-48 px; a retina screen doubles that
IMAGE_TYPES = "PNG, JPEG, WebP or GIF"


class SpecEyesChatState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    # the last turn's evidence (the answer itself is the last AIMessage)
    route: Route | None
    draft: Draft | None
    agent_steps: list[AgentStep]
    error: str | None


class _ChatInput(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class _ChatOutput(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: Route | None
    error: str | None


# --- what the reply says ---------------------------------------------------------------------

_TAG = re.compile(r"</?(?:answer|think|tool_call|tool_response|code|sandbox_output)>", re.I)
_THINKING = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
_FRAGMENT = re.compile(r"<tool_call>.*|<code>.*", re.S | re.I)


def chat_reply(answer: str | None, options: Sequence[str] | None) -> str | None:
    """The answer as a person reads it, or None when there is none to give.

    With options: the option it names (a bare letter spelled out: ``B`` -> ``B. green``;
    the option's own words as they are), else None. Without: the answer's text with the
    protocols' tags, thinking and tool-call fragments taken out."""
    visible = extract_answer(answer or "")
    text = visible if visible is not None else _FRAGMENT.sub("", _THINKING.sub("", answer or ""))
    text = " ".join(_TAG.sub(" ", text).split())
    if options:
        letter = extract_choice(text, options)
        if letter is None:
            return None
        bare = text.strip("().: ")
        return f"{letter}. {options[ord(letter) - 65]}" if bare == letter else text
    return text or None


def _thinking(text: str) -> str:
    """A tool-calling turn's reasoning, for the message that shows the call."""
    inner = re.search(r"<think>(.*?)(?:</think>|$)", text, re.S | re.I)
    shown = inner.group(1) if inner else _FRAGMENT.sub("", text)
    return " ".join(_TAG.sub(" ", shown).split())


# --- the person's images ---------------------------------------------------------------------


def _names(message: BaseMessage) -> list[str]:
    """How the person's images in a message are called: their file names, where sent."""
    content = message.content if isinstance(message.content, list) else []
    names = []
    for block in content:
        if image_ref(block):
            names.append(str(block_metadata(block).get("name") or "your image"))
    return names


def _displayed(
    message: HumanMessage, store: ImageStore, image_url: str | None, thread: str | None
) -> tuple[HumanMessage, list[str], list[str]]:
    """The message as the thread keeps it: each image a thumbnail naming its stored image
    (and where a server serves it), each image that cannot be read a note saying why.
    Returns it with what could not be read and which files were not images."""
    failed: list[str] = []
    not_images: list[str] = []
    content: list[Any] = []
    blocks: list[Any] = message.content if isinstance(message.content, list) else [message.content]
    for block in blocks:
        key = image_ref(block)
        if key is None:
            if block_metadata(block).get(NOT_READ):
                not_images.append(str(block_metadata(block).get("filename")))
            elif is_unreadable(block):
                failed.append(block["text"].removeprefix(UNREADABLE_NOTE).rstrip("]"))
            content.append(block)
            continue
        metadata = dict(block_metadata(block))
        name = metadata.get("name") or "your image"
        try:
            data = thumbnail(store.get(key), THUMBNAIL_SIDE)
        except ImageLoadError as exc:  # gone from the store since: said of the person's file
            why = cannot_read(exc, key, name)
            failed.append(why)
            content.append(unreadable(why))
            continue
        metadata[STORED] = key
        if image_url:
            metadata["url"] = image_url.format(
                digest=key.removeprefix("blob://"), thread_id=quote(thread or "", safe="")
            )
        content.append(
            {"type": "image", "mimeType": "image/jpeg", "data": data, "metadata": metadata}
        )
    shown = message.model_copy(update={"content": content})
    return shown, failed, not_images


def _refusal(
    failed: list[str], not_images: list[str], has_image: bool, question: str
) -> str | None:
    """What a turn that cannot run says instead (no model is called), or None."""
    if failed:
        return (
            f"I could not read {'; '.join(failed)}. Please send it again as a {IMAGE_TYPES} image."
        )
    if not has_image and not_images:
        return (
            f"I received {', '.join(not_images)}, which is not an image. I answer questions "
            f"about images: attach a {IMAGE_TYPES} image and ask again."
        )
    if not has_image:
        return (
            "I answer questions about images, and this conversation has none yet: attach an "
            f"image ({IMAGE_TYPES}) and ask your question."
        )
    if not question:
        return "Ask a question about the image."
    return None


def _refused_with(refusal: str | None) -> dict[str, Any]:
    """A turn's reset evidence, with the reply that says why it did not run (if it did not)."""
    return {
        "messages": [AIMessage(content=refusal)] if refusal else [],
        "route": None,
        "draft": None,
        "agent_steps": [],
        "error": refusal,
    }


# --- the agent's steps, as chat UIs show them --------------------------------------------------


def step_messages(agent_messages: Sequence[BaseMessage], store: ImageStore) -> list[BaseMessage]:
    """The agent loop's tool calls and results as a chat shows them: each calling turn as an
    AI message with its reasoning and ``tool_calls``, each result as a tool message with its
    text, and the crop it returned as a thumbnail in the tool message's ``artifact`` (never
    sent to a model). The loop's own prompt, corrections and final turn are left out. Ids
    follow the tool calls', so a step streamed as it happened and the same step in the
    turn's final messages are one message to a client that merges by id (``useStream``)."""
    return [shown for m in agent_messages if (shown := _shown_step(m, store)) is not None]


def _shown_step(message: BaseMessage, store: ImageStore) -> BaseMessage | None:
    if isinstance(message, AIMessage) and message.tool_calls:
        return AIMessage(
            content=_thinking(message_text(message)),
            tool_calls=message.tool_calls,
            id=f"speceyes-call-{message.tool_calls[0]['id']}",
        )
    if not isinstance(message, ToolMessage):
        return None
    blocks = message.content if isinstance(message.content, list) else [message.content]
    text = " ".join(b if isinstance(b, str) else str(b.get("text", "")) for b in blocks)
    artifact = dict(message.artifact) if isinstance(message.artifact, dict) else {}
    artifact.pop("image", None)  # where the tool read from: the store's business
    crops = [k for k in map(image_ref, blocks) if k]
    if crops:
        try:
            artifact["crop"] = {
                "type": "image",
                "mimeType": "image/jpeg",
                "data": thumbnail(store.get(crops[0]), 2 * THUMBNAIL_SIDE),
                "metadata": {STORED: crops[0]},
            }
        except ImageLoadError:
            pass  # the crop is gone from the store: the text still says what it was
    return ToolMessage(
        content=text.strip() or "(image)",
        tool_call_id=message.tool_call_id,
        name=message.name,
        artifact=artifact or None,
        status=message.status,
        id=f"speceyes-result-{message.tool_call_id}",
    )


class StepsAsTheyHappen(BaseCallbackHandler):
    """Puts the agent's steps on the chat's own messages stream as each agent node ends,
    so a chat UI shows each zoom as it happens (the inner run is kept off that stream:
    :func:`~speceyes_graph.integrations.compose.run_unstreamed`). ``push_message`` is
    LangGraph's way to stream a message a node has not returned yet; it is called in the
    chat node's own config, so the steps stream in the chat's namespace (on langgraph 1.2.19
    and later: :data:`~speceyes_graph._compat.PUSHED_MESSAGES_KEEP_THE_GRAPH`; before, the
    steps come with the turn's answer)."""

    run_inline = True  # in the node's own thread or loop, in order

    def __init__(self, chat_config: RunnableConfig, store: ImageStore):
        self.chat_config, self.store = chat_config, store
        self.nodes: set[UUID] = set()

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if metadata and kwargs.get("name") == metadata.get("langgraph_node"):
            self.nodes.add(run_id)  # a node's run, not a runnable inside one

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if run_id not in self.nodes or not PUSHED_MESSAGES_KEEP_THE_GRAPH:
            self.nodes.discard(run_id)
            return
        self.nodes.discard(run_id)
        written = outputs.get("messages") if isinstance(outputs, dict) else None
        shown = step_messages(written if isinstance(written, list) else [], self.store)
        if shown:
            with set_config_context(self.chat_config) as chat_node:
                for message in shown:  # the node's return keeps them: no state write here
                    chat_node.run(push_message, message, state_key=None)


def _with_handler(config: RunnableConfig, handler: BaseCallbackHandler) -> RunnableConfig:
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.copy()
        callbacks.add_handler(handler, inherit=True)
    else:
        callbacks = [*(callbacks or []), handler]
    return {**config, "callbacks": callbacks}


# --- the graph ---------------------------------------------------------------------------------


def create_speceyes_chat_graph(
    *, store: ImageStore | None = None, image_url: str | None = None, **graph_kwargs: Any
) -> StateGraph[SpecEyesChatState, SpecEyesContext, _ChatInput, _ChatOutput]:
    """A chat front for SpecEyes (uncompiled; compile with your checkpointer).

    Takes the arguments of :func:`~speceyes_graph.create_speceyes_graph` (models, tools, gate,
    limits...). Per-run context (``tau``, ``mode``...) is passed through. ``image_url``: where
    a server serves the person's images, a template with ``{digest}`` and ``{thread_id}``
    (the served graphs use ``/speceyes/images/{digest}?thread_id={thread_id}``); each
    thumbnail's metadata then carries its ``url``.
    """
    store = store or default_store()
    speceyes = create_speceyes_graph(store=store, **graph_kwargs).compile(name="speceyes")

    def ask(state: SpecEyesChatState, config: RunnableConfig) -> Steps:
        messages = state.get("messages") or []
        last = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        if last is None:
            return _refused_with(_refusal([], [], False, ""))
        thread = (config.get("configurable") or {}).get("thread_id")
        # pasted pixels and URLs -> the store (a URL fetched under the store's policy); each
        # image a thumbnail (decodes and fetches: off the event loop)
        shown, failed, not_images = yield Blocking(
            lambda: _displayed(
                readable_images(dehydrate(last, store), store), store, image_url, thread
            )
        )
        turn = [*messages[:-1], shown] if messages[-1] is last else [*messages, shown]
        query = chat_query(turn)
        has_image = bool(query and query["images"])
        refusal = _refusal(failed, not_images, has_image, query["question"] if query else "")
        return {**_refused_with(refusal), "messages": [shown, *_refused_with(refusal)["messages"]]}

    def answer(state: SpecEyesChatState, config: RunnableConfig) -> Steps:
        # the query is read from the checkpointed messages, so a run resumed here (on another
        # worker, after a crash) asks the same question
        messages = state.get("messages") or []
        query = chat_query(messages)
        assert query is not None  # ask let the turn through
        last = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        # Without checkpoints of its own: the chat thread's checkpoints hold the turn (its
        # question is in the messages), and a resumed turn runs the query again from intake.
        # `speceyes` itself stays the subgraph that xray drawings and Studio show.
        run = speceyes.copy(update={"checkpointer": False})
        relay = StepsAsTheyHappen(config, store)
        try:
            out = yield from run_unstreamed(run, query, _with_handler(config, relay))
        except GraphBubbleUp:  # an interrupt, a cancellation: LangGraph's to handle
            raise
        except Exception as exc:  # the run's own failure: the thread says so, and goes on
            out = {"error": f"{type(exc).__name__}: {exc}"}
        steps = yield Blocking(step_messages, (out.get("agent_messages") or [], store))
        reply = chat_reply(out.get("answer"), query["options"])
        if out.get("error"):
            names = " and ".join(_names(last)) or "your image"
            text = f"I could not answer about {names}: {out['error']}"
        elif reply is None and query["options"]:
            text = "I could not tell which of the options is right."
        else:
            text = reply or "I could not find an answer."
        meta = {
            "speceyes": {
                "route": out.get("route"),
                "score": gate_score(out),
                "answer": out.get("answer"),  # the model's own text, for whoever debugs it
            }
        }
        return {
            "messages": [*steps, AIMessage(content=text, response_metadata=meta)],
            "route": out.get("route"),
            "draft": out.get("draft"),
            "agent_steps": out.get("agent_steps") or [],
            "error": out.get("error"),
        }

    def refused(state: SpecEyesChatState) -> str:
        return "refused" if state.get("error") else "ask the models"

    graph = PixelFreeGraph(
        SpecEyesChatState,
        input_schema=_ChatInput,
        output_schema=_ChatOutput,
        context_schema=SpecEyesContext,
    )
    # pasted images go to the store as LangGraph takes the turn: its record of the input,
    # the saved writes and every checkpoint of `messages` hold blob:// blocks
    graph.keep_input = functools.partial(pasted_images_kept, store=store)
    graph.add_node("ask", node(ask))
    graph.add_node("answer", node(answer))
    graph.add_edge(START, "ask")
    graph.add_conditional_edges(
        "ask", router(refused), {"refused": END, "ask the models": "answer"}
    )
    graph.add_edge("answer", END)
    return graph
