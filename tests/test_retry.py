"""A run redelivered after its worker died answers exactly like a fresh run.

A serving engine (LangGraph Platform, Aegra) that loses a worker hands the run to another
with the same ``run_id``. LangGraph treats a run whose ``run_id`` matches the thread's last
checkpoint as a re-entry: it resumes from that checkpoint and ignores the input it is sent
again. So whatever the run had not yet turned into state must be in the checkpoint: the
input keys are kept, pixel-free, in the checkpoints taken before ``intake`` reads them
(``speceyes_graph.state.RunInput``), and gone from every later one.

These tests stop a run before each node (``interrupt_before``: the checkpoint a dead
worker leaves), then send the same input with the same ``run_id`` to a graph compiled
without the interrupt, as the worker that takes the run over would.
"""

from __future__ import annotations

import asyncio
import base64
import uuid

import pytest
from checkpoint_pixels import describe, leaks, saver_rows
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import SpeculationOptions, create_speceyes_graph
from speceyes_graph.integrations.chat import create_speceyes_chat_graph
from speceyes_tools import ImageStore
from speceyes_tools.blobs import MemoryBlobs

# (name, graph settings, judge says, draft separability, the nodes that run)
SCENARIOS = {
    "accepted": ({}, "no", 9.0, ["intake", "judge", "speculate", "gate"]),
    "rejected": ({}, "no", 2.0, ["intake", "judge", "speculate", "gate", "agent_loop"]),
    "agentic": ({}, "yes", 9.0, ["intake", "judge", "agent_loop"]),
    "agent-only": ({"mode": "agent"}, "no", 9.0, ["intake", "agent_loop"]),
    "depth-1": (
        {"speculation": SpeculationOptions(depth=1)},
        "yes",
        9.0,
        ["intake", "judge", "speculate_tools", "agent_loop"],
    ),
    "specreason": ({"mode": "specreason"}, "no", 9.0, ["intake", "specreason"]),
}
CASES = [(name, n) for name, (_, _, _, nodes) in SCENARIOS.items() for n in nodes]
COMPARED = ("answer", "route", "error", "judge_output", "stop_reason")


def build(name: str):
    settings, judged, separability, _ = SCENARIOS[name]
    return create_speceyes_graph(
        judge=judge(judged),
        speculator=speculator("A", separability),
        agent=deepeyes_agent(answer="B"),
        **settings,
    )


def summary(out: dict) -> dict:
    steps = [s.get("tool") or s.get("model_text") for s in out.get("agent_steps") or []]
    return {**{k: out.get(k) for k in COMPARED}, "steps": steps}


def run_config(thread: str, run_id: str) -> dict:
    # as the LangGraph API and Aegra pass it: the run id in the run's metadata
    return {"configurable": {"thread_id": thread}, "run_id": run_id, "metadata": {"run_id": run_id}}


def data_url(path: str) -> str:
    return "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_scenarios_run_the_nodes_they_name(scene, scenario):
    query = {"question": "What colour is it?", "images": [scene], "options": ["A", "B"]}
    updates = build(scenario).compile().stream(query, stream_mode="updates")
    assert [next(iter(u)) for u in updates] == SCENARIOS[scenario][3]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("scenario", "node"), CASES)
def test_a_redelivered_run_answers_like_a_fresh_one(scene, scenario, node, asynchronous):
    query = {"question": "What colour is it?", "images": [data_url(scene)], "options": ["A", "B"]}
    graph, saver = build(scenario), InMemorySaver()
    fresh = graph.compile().invoke(query)
    assert fresh.get("error") is None
    config = run_config("t", str(uuid.uuid4()))
    dying = graph.compile(checkpointer=saver, interrupt_before=[node])
    taking_over = graph.compile(checkpointer=saver)
    if asynchronous:
        asyncio.run(dying.ainvoke(query, config))
        assert dying.get_state(config).next == (node,)
        again = asyncio.run(taking_over.ainvoke(query, config))
    else:
        dying.invoke(query, config)
        assert dying.get_state(config).next == (node,)
        again = taking_over.invoke(query, config)
    assert summary(again) == summary(fresh)
    # no pixels in anything stored for the thread (checkpoints, LangGraph's record of the
    # input, saved writes): the data: URL was kept as a blob key as the run took it
    assert not leaks(saver_rows(saver)), describe(leaks(saver_rows(saver)))


def test_the_input_is_kept_only_until_intake_has_read_it(scene):
    """Checkpoints before intake hold the input (references only); later ones do not, so a
    later run on the thread that omits a key cannot inherit it."""
    graph, saver = build("accepted"), InMemorySaver()
    app = graph.compile(checkpointer=saver)
    config = run_config("t", str(uuid.uuid4()))
    app.invoke({"question": "Colour?", "images": [data_url(scene)], "options": ["A", "B"]}, config)
    history = list(app.get_state_history(config))
    before_intake = [s for s in history if s.next == ("intake",)]
    assert before_intake and before_intake[0].values["images"][0].startswith("blob://")
    assert "options" not in history[0].values and "images" not in history[0].values
    later = app.invoke({"question": "And now?", "images": [scene]}, run_config("t", "r2"))
    assert later.get("error") is None
    assert app.get_state(config).values["query"]["options"] is None


def test_a_run_abandoned_before_intake_leaves_nothing_to_the_next(scene):
    """A run stopped before intake and never taken over: the next run on the thread (a new
    run id) does not inherit its options."""
    graph, saver = build("accepted"), InMemorySaver()
    dying = graph.compile(checkpointer=saver, interrupt_before=["intake"])
    dying.invoke(
        {"question": "Colour?", "images": [scene], "options": ["A", "B"]},
        run_config("t", str(uuid.uuid4())),
    )
    app = graph.compile(checkpointer=saver)
    config = run_config("t", str(uuid.uuid4()))
    out = app.invoke({"question": "And now?", "images": [scene]}, config)
    assert out.get("error") is None and app.get_state(config).values["query"]["options"] is None


def chat_turn(scene: str) -> dict:
    pasted = {"type": "image", "base64": data_url(scene).split(",", 1)[1], "mime_type": "image/png"}
    text = {"type": "text", "text": "What colour is it?\nOptions: red, blue"}
    return {"messages": [HumanMessage(content=[pasted, text])]}


def chat_graph():
    return create_speceyes_chat_graph(
        judge=judge("no"), speculator=speculator("A", 9.0), agent=deepeyes_agent()
    )


@pytest.mark.parametrize("node", ["ask", "answer"])
def test_a_redelivered_chat_turn_is_answered_once(scene, node):
    graph = chat_graph()
    saver = InMemorySaver()
    turn = chat_turn(scene)
    config = run_config("chat", str(uuid.uuid4()))
    graph.compile(checkpointer=saver, interrupt_before=[node]).invoke(turn, config)
    out = graph.compile(checkpointer=saver).invoke(turn, config)
    kinds = [m.type for m in out["messages"]]
    assert kinds == ["human", "ai"], kinds  # the turn once, its answer once
    assert not leaks(saver_rows(saver)), describe(leaks(saver_rows(saver)))


class WorkerDied(Exception):
    """The worker's process ended: nothing after it reaches the checkpointer."""


class DiesAfterInput(InMemorySaver):
    """A checkpointer whose worker dies once the run's input checkpoint is saved: before the
    step that spreads the input over the state's keys is saved (``writes_saved=False``), or
    after its writes are but before its checkpoint (``writes_saved=True``)."""

    def __init__(self, writes_saved: bool) -> None:
        super().__init__()
        self.writes_saved, self.dying, self.dead = writes_saved, True, False

    def put(self, config, checkpoint, metadata, new_versions):
        if self.dying and (self.dead or metadata.get("source") != "input"):
            self.dead = True
            raise WorkerDied
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        if self.dying and (self.dead or not self.writes_saved):
            self.dead = True
            raise WorkerDied
        return super().put_writes(config, writes, task_id, task_path)


@pytest.mark.parametrize("writes_saved", [False, True], ids=["no-writes", "writes-saved"])
@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_a_run_killed_before_its_first_node_finishes_is_taken_over(scene, kind, writes_saved):
    """A worker killed before the run's first node is checkpointed leaves only LangGraph's
    record of the input (and maybe the writes that spread it over the state): the run taken
    over resumes from that record, pixel-free, and answers like a fresh run."""
    if kind == "plain":
        graph = build("rejected")
        sent = {
            "question": "What colour is it?",
            "images": [data_url(scene)],
            "options": ["A", "B"],
        }
    else:
        graph, sent = chat_graph(), chat_turn(scene)
    fresh = graph.compile().invoke(sent)
    saver = DiesAfterInput(writes_saved)
    config = run_config("t", str(uuid.uuid4()))
    with pytest.raises(WorkerDied):
        graph.compile(checkpointer=saver).invoke(sent, config)
    assert [c.metadata["source"] for c in saver.list(config)] == ["input"]
    assert any(saver.writes.values()) == writes_saved  # langgraph-checkpoint 2 leaves empty entries
    assert not leaks(saver_rows(saver)), describe(leaks(saver_rows(saver)))
    saver.dying = False
    again = graph.compile(checkpointer=saver).invoke(sent, config)
    if kind == "plain":
        assert summary(again) == summary(fresh) and again["route"] == "rejected-agentic"
    else:
        assert [(m.type, m.content) for m in again["messages"][1:]] == [
            (m.type, m.content) for m in fresh["messages"][1:]
        ]
    # resumed, not started again: one input checkpoint, and still no pixels anywhere
    assert [c.metadata["source"] for c in saver.list(config)].count("input") == 1
    assert not leaks(saver_rows(saver)), describe(leaks(saver_rows(saver)))


class DroppedBlobs(MemoryBlobs):
    """Blobs shared by workers; ``dropping``: a dying worker's writes never land (or fail)."""

    def __init__(self, dropping: bool = True, error: Exception | None = None):
        super().__init__()
        self.dropping, self.error = dropping, error

    def put(self, key: str, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        if not self.dropping:
            super().put(key, data)


def plain_graph(store: ImageStore):
    return create_speceyes_graph(
        judge=judge("no"), speculator=speculator("A", 9.0), agent=deepeyes_agent(), store=store
    )


def test_an_image_the_store_cannot_write_fails_its_query_clearly(scene):
    """On an event loop the pasted bytes are written in the background; a write that fails
    fails the query at intake with the store's error (and nothing else of the run goes on)."""
    blobs = DroppedBlobs(error=OSError("no space left on device"))
    sent = {"question": "What colour is it?", "images": [data_url(scene)]}
    out = asyncio.run(plain_graph(ImageStore(blobs=blobs)).compile().ainvoke(sent))
    assert out["error"].startswith("input: ") and "no space left on device" in out["error"]
    assert out["answer"] is None and out["route"] is None


def test_a_worker_killed_before_the_pasted_image_is_stored_fails_the_run_clearly(scene):
    """The window the background write leaves: LangGraph saved the input record (the image's
    key) and the worker died before the bytes landed. The run taken over cannot answer; it
    fails at intake and says to send the image again, never answers without the image."""
    blobs = DroppedBlobs(dropping=True)
    sent = {"question": "What colour is it?", "images": [data_url(scene)]}
    saver, config = DiesAfterInput(writes_saved=False), run_config("t", str(uuid.uuid4()))
    dying = plain_graph(ImageStore(blobs=blobs)).compile(checkpointer=saver)
    with pytest.raises(WorkerDied):
        asyncio.run(dying.ainvoke(sent, config))
    saver.dying, blobs.dropping = False, False
    taking_over = plain_graph(ImageStore(blobs=blobs)).compile(checkpointer=saver)
    out = asyncio.run(taking_over.ainvoke(sent, config))
    assert out["answer"] is None and "send it again" in out["error"], out["error"]
