"""What ``speceyes_graph/_compat.py`` relies on in its dependencies, one test per entry.

Each test fails when the dependency changes what the entry relies on (a renamed private
method, a moved class, another "no value" marker), so a release that breaks one shows here
and not as a quiet change in behaviour. CI runs them at the newest releases and at the
declared floors (``scripts/floors.sh``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import set_config_context
from langgraph.channels import EphemeralValue
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from speceyes_graph import _compat
from speceyes_graph.state import RunInput


class _State(TypedDict, total=False):
    question: str
    answer: str
    messages: list[Any]


class _Runs(BaseCallbackHandler):
    """The names of the chain runs a graph traced."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.names.append(kwargs.get("name") or "")


def test_runnable_callable_runs_each_side_in_place_and_traces_no_run_of_its_own():
    """One node, two implementations: ``invoke`` runs the sync one on the caller's thread,
    ``ainvoke`` the async one; ``config`` is injected; LangGraph's node run is the only run."""
    ran: list[tuple[str, bool]] = []

    def sync(state: _State, config: RunnableConfig) -> _State:
        ran.append(("sync", "configurable" in config))
        return {"answer": "s"}

    async def asynchronous(state: _State, config: RunnableConfig) -> _State:
        ran.append(("async", "configurable" in config))
        return {"answer": "a"}

    graph = StateGraph(_State)
    graph.add_node(
        "answer", _compat.RunnableCallable(sync, asynchronous, name="answer", trace=False)
    )
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    compiled = graph.compile()
    runs = _Runs()
    assert compiled.invoke({"question": "q"}, {"callbacks": [runs]})["answer"] == "s"
    assert asyncio.run(compiled.ainvoke({"question": "q"}))["answer"] == "a"
    assert ran == [("sync", True), ("async", True)]
    assert runs.names.count("answer") == 1  # no second run inside the node's own


def test_the_messages_stream_handler_is_what_streams_a_subgraphs_messages():
    """An inner graph's node writes a message. Streamed with ``messages`` and subgraphs, the
    caller sees it, unless the inner run's callbacks went through
    :func:`~speceyes_graph._compat.without_messages_stream`."""

    def write(state: _State) -> _State:
        return {"messages": [AIMessage("inner", id="inner-1")]}

    inner = StateGraph(_State)
    inner.add_node("write", write)
    inner.add_edge(START, "write")
    inner_graph = inner.compile()

    def outer_node(filtered: bool):
        def run(state: _State, config: RunnableConfig) -> _State:
            if filtered:  # as the ambient config too: LangGraph merges its callbacks back
                callbacks = _compat.without_messages_stream(config["callbacks"])
                config = {**config, "callbacks": callbacks}
            with set_config_context(config) as context:
                context.run(inner_graph.invoke, {"question": "q"}, config)
            return {"answer": "done"}

        return run

    def streamed(filtered: bool) -> list[str]:
        outer = StateGraph(_State)
        outer.add_node("outer", outer_node(filtered))
        outer.add_edge(START, "outer")
        stream = outer.compile().stream({"question": "q"}, stream_mode="messages", subgraphs=True)
        return [chunk[0].content for _, chunk in stream]

    assert streamed(filtered=False) == ["inner"]
    assert streamed(filtered=True) == []
    assert _compat.without_messages_stream(None) is None


def test_no_value_is_the_marker_a_channel_without_a_value_checkpoints():
    channel = EphemeralValue(str)
    assert channel.checkpoint() is _compat.NO_VALUE
    restored = RunInput(str).from_checkpoint(channel.checkpoint())
    assert not restored.is_available()
    assert RunInput(str).from_checkpoint("kept").get() == "kept"


def test_the_input_channel_sees_the_input_before_any_checkpoint_holds_it():
    """A compiled graph's ``__start__`` channel, replaced, changes the input as LangGraph
    takes it: the first checkpoint of the run holds what ``keep`` made of it."""

    def answer(state: _State) -> _State:
        return {"answer": state["question"]}

    graph = StateGraph(_State)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    compiled = graph.compile(checkpointer=InMemorySaver())
    kept = RunInput(_State, keep=lambda value: {**value, "question": "kept"})
    _compat.set_input_channel(compiled, kept)
    config = {"configurable": {"thread_id": "t"}}
    assert compiled.invoke({"question": "raw"}, config)["answer"] == "kept"
    history = list(compiled.get_state_history(config))
    first = history[-1]  # the "input" checkpoint: the run's input as LangGraph recorded it
    assert first.metadata["source"] == "input"
    assert "raw" not in repr(compiled.checkpointer.get_tuple(first.config).checkpoint)


class _Recording(_compat.StreamsWhenAsked, BaseChatModel):
    """Answers "ok", streamed as two chunks; records which path langchain-core took."""

    paths: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        self.paths.append("generate")
        return ChatResult(generations=[ChatGeneration(message=AIMessage("ok"))])

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        self.paths.append("stream")
        for text in ("o", "k"):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk


def test_a_model_streams_only_when_asked_even_under_a_messages_stream():
    """Inside a graph streamed with ``messages`` (a handler that takes tokens), ``invoke``
    generates in one go; ``stream()`` streams. langchain-core asks the private hooks this
    mixin overrides; a langchain-core that asked others would stream the first call."""
    model = _Recording(paths=[])

    def call(state: _State) -> _State:
        return {"answer": model.invoke([HumanMessage("hi")]).content}

    graph = StateGraph(_State)
    graph.add_node("call", call)
    graph.add_edge(START, "call")
    chunks = list(graph.compile().stream({"question": "q"}, stream_mode="messages"))
    assert model.paths == ["generate"] and [c[0].content for c in chunks] == ["ok"]
    assert [c.content for c in model.stream("hi") if c.content] == ["o", "k"]
    assert model.paths == ["generate", "stream"]
    assert "_should_stream" in vars(_compat.StreamsWhenAsked)
    assert hasattr(BaseChatModel, "_should_stream")  # what langchain-core asks


def test_content_block_types_are_computed_once_with_the_same_answer():
    """langchain-core recomputes these type hints for every image block it traces; the
    package computes them once: the same answer, and tracing formats our image blocks as it
    did. Run on a thread of its own to show it holds process-wide."""
    from langchain_core.language_models.chat_models import _format_for_tracing
    from langchain_core.messages import content

    import speceyes_graph.messages  # noqa: F401 - importing the package applies it

    cached = content._get_data_content_block_types
    assert hasattr(cached, "cache_info")
    assert cached() == cached.__wrapped__() and "image" in cached()
    block = {"type": "image", "url": "blob://abc", "mime_type": "image/png"}
    seen: list[Any] = []
    thread = threading.Thread(
        target=lambda: seen.append(_format_for_tracing([HumanMessage(content=[block])])[0])
    )
    thread.start()
    thread.join()
    assert seen[0].content[0] == {"type": "image_url", "image_url": {"url": "blob://abc"}}


def test_a_nested_runs_values_reach_the_callers_stream_only_through_its_stream_key():
    """An inner graph run inside a node, streamed with subgraphs: its ``values`` reach the
    caller's stream, unless the inner run's config went through
    :func:`~speceyes_graph._compat.without_values_stream`, which keeps its ``updates``."""

    def write(state: _State) -> _State:
        return {"answer": "inner"}

    inner = StateGraph(_State)
    inner.add_node("write", write)
    inner.add_edge(START, "write")
    inner_graph = inner.compile()

    def streamed(filtered: bool) -> set[tuple[bool, str]]:
        def run(state: _State, config: RunnableConfig) -> _State:
            if filtered:
                config = _compat.without_values_stream(config)
            with set_config_context(config) as context:
                context.run(inner_graph.invoke, {"question": "q"}, config)
            return {"answer": "done"}

        outer = StateGraph(_State)
        outer.add_node("outer", run)
        outer.add_edge(START, "outer")
        chunks = outer.compile().stream(
            {"question": "q"}, stream_mode=["values", "updates"], subgraphs=True
        )
        return {(bool(ns), mode) for ns, mode, _ in chunks}

    both = {(False, "values"), (False, "updates"), (True, "values"), (True, "updates")}
    assert streamed(filtered=False) == both
    assert streamed(filtered=True) == both - {(True, "values")}
    assert _compat.without_values_stream({}) == {}


def test_push_message_streams_in_the_nodes_graph_where_the_flag_says_so():
    """A root node's ``push_message``: streamed in the root namespace (a plain stream sees
    it) exactly where :data:`~speceyes_graph._compat.PUSHED_MESSAGES_KEEP_THE_GRAPH` says
    so; before langgraph 1.2.19 it came labelled with the node's task."""
    from langgraph.graph.message import push_message

    def node(state: _State) -> _State:
        push_message(AIMessage("pushed", id="pushed-1"), state_key=None)
        return {"answer": "done"}

    graph = StateGraph(_State)
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    chunks = list(
        graph.compile().stream({"question": "q"}, stream_mode="messages", subgraphs=True)
    )
    namespaces = [ns for ns, (message, _) in chunks if message.content == "pushed"]
    assert len(namespaces) == 1
    assert (namespaces[0] == ()) == _compat.PUSHED_MESSAGES_KEEP_THE_GRAPH
