"""Runs on a reused thread start clean, with in-memory, SQLite and Postgres checkpointers
(Postgres with the Postgres blob store too, as workers of a deployment share them), the
state never holds pixels, interrupted runs resume, and a chat thread moves between workers."""

import base64
import sqlite3

import pytest
from checkpoint_pixels import describe, leaks, postgres_rows, saver_rows, thread_sizes
from conftest import write_scene
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_graph.state import SpecEyesOutput

OUTPUT_KEYS = set(SpecEyesOutput.__annotations__)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request, tmp_path):
    """(checkpointer, image store): in memory; SQLite; or Postgres for both, as several
    workers of a deployment share them."""
    if request.param == "memory":
        yield InMemorySaver(), None
    elif request.param == "sqlite":
        conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
        yield SqliteSaver(conn), None
        conn.close()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg_pool import ConnectionPool

        from speceyes_tools import ImageStore, PostgresBlobs

        dsn = request.getfixturevalue("postgres_dsn")
        kwargs = {"autocommit": True, "prepare_threshold": 0}
        with ConnectionPool(dsn, kwargs=kwargs, max_size=4) as pool:
            saver = PostgresSaver(pool)
            saver.setup()
            blobs = PostgresBlobs(dsn)
            yield saver, ImageStore(blobs=blobs)
            blobs.close()


def build(storage, interrupt_before=None, **kw):
    # "big" questions are judged tool-free and drafted confidently; others go to the agent
    checkpointer, store = storage
    return create_speceyes_graph(
        judge=judge(lambda q: "no" if "big" in q else "yes"),
        speculator=speculator("A", 9.0),
        agent=deepeyes_agent(answer="B"),
        store=store,
        **kw,
    ).compile(checkpointer=checkpointer, interrupt_before=interrupt_before)


def fresh(storage, inputs):
    """What the same query returns on a brand-new thread: the reference for every key."""
    return build(storage).invoke(inputs, {"configurable": {"thread_id": f"fresh-{id(inputs)}"}})


def same_outputs(a, b):
    drop = {"timings"}  # wall times differ run to run; their keys are compared separately
    return {k: a.get(k) for k in OUTPUT_KEYS - drop} == {k: b.get(k) for k in OUTPUT_KEYS - drop}


def test_bad_query_then_good_query_on_one_thread(storage, scene):
    g = build(storage)
    cfg = {"configurable": {"thread_id": "t1"}}
    bad = g.invoke({"question": "big?", "images": ["/no/such/image.png"]}, cfg)
    assert bad["error"].startswith("input: ") and bad["answer"] is None
    good_input = {"question": "big?", "images": [scene], "options": ["red", "blue"]}
    good = g.invoke(good_input, cfg)
    assert good["error"] is None and good["route"] == "speculative" and good["answer"] == "A"
    assert same_outputs(good, fresh(storage, good_input))
    assert set(good["timings"]) == {"intake", "judge", "speculate"}


def test_agentic_then_speculative_then_agentic(storage, scene):
    g = build(storage)
    cfg = {"configurable": {"thread_id": "t2"}}
    first = g.invoke({"question": "tiny?", "images": [scene], "query_id": "one"}, cfg)
    assert first["route"] == "judged-agentic" and len(first["agent_steps"]) == 2
    second_input = {"question": "big?", "images": [scene]}
    second = g.invoke(second_input, cfg)
    # nothing of the agentic query survives into the speculative one
    assert second["route"] == "speculative" and second["agent_steps"] == []
    assert second["agent_messages"] == [] and second["stop_reason"] is None
    assert "agent" not in second["timings"]
    assert g.get_state(cfg).values["query"]["query_id"] is None  # not inherited either
    assert same_outputs(second, fresh(storage, second_input))
    third = g.invoke({"question": "tiny?", "images": [scene]}, cfg)
    assert third["draft"] is None and len(third["agent_steps"]) == 2  # no stale draft either


def test_inputs_are_not_inherited_by_later_runs(storage, scene, tmp_path):
    g = build(storage)
    cfg = {"configurable": {"thread_id": "t3"}}
    g.invoke({"question": "big?", "images": [scene], "options": ["red", "blue"]}, cfg)
    # no images and no options this time: the earlier ones must not be used
    out = g.invoke({"question": "tiny?"}, cfg)
    query = g.get_state(cfg).values["query"]
    assert query["images"] == [] and query["options"] is None
    assert out["route"] == "judged-agentic"
    assert "no image is attached" in out["agent_steps"][0]["tool_calls"][0]["error"]


def test_a_failed_run_does_not_poison_the_thread_in_raise_mode(storage, scene):
    from speceyes_graph import SpecEyesError

    g = build(storage, on_error="raise")
    cfg = {"configurable": {"thread_id": "t4"}}
    with pytest.raises(SpecEyesError, match="image file not found"):
        g.invoke({"question": "big?", "images": ["/no/such.png"]}, cfg)
    out = g.invoke({"question": "big?", "images": [scene]}, cfg)
    assert out["error"] is None and out["route"] == "speculative"


def pasted_turn(data_url: str, text: str) -> dict:
    from langchain_core.messages import HumanMessage

    pasted = {"type": "image_url", "image_url": {"url": data_url}}
    return {"messages": [HumanMessage(content=[{"type": "text", "text": text}, pasted])]}


def chat(storage):
    from speceyes_graph import create_speceyes_chat_graph

    checkpointer, store = storage
    return create_speceyes_chat_graph(
        judge=judge(lambda q: "no" if "big" in q else "yes"),
        speculator=speculator("A", 9.0),
        agent=deepeyes_agent(answer="B"),
        store=store,
    ).compile(checkpointer=checkpointer)


def test_state_and_checkpoints_hold_no_pixels(storage, tmp_path):
    """Pasted images, plain and chat, agentic and speculative: no stored row holds image data,
    LangGraph's record of each run's input and the writes saved for each step included
    (tests/checkpoint_pixels.py decodes every row and searches its bytes)."""
    scene = write_scene(tmp_path / "big.png", size=(2000, 1500), box=(100, 100, 300, 300))
    data_url = "data:image/png;base64," + base64.b64encode(open(scene, "rb").read()).decode()
    g = build(storage)
    cfg = {"configurable": {"thread_id": "t5"}}
    out = g.invoke({"question": "tiny?", "images": [data_url]}, cfg)
    assert out["route"] == "judged-agentic" and out["answer"] == "B"
    # the crop came back as a reference, and the input became one
    tool_msg = next(m for m in out["agent_messages"] if m.type == "tool")
    refs = [b["url"] for b in tool_msg.content if isinstance(b, dict) and b.get("type") == "image"]
    assert len(refs) == 1 and refs[0].startswith("blob://")
    values = g.get_state(cfg).values
    assert values["query"]["images"][0].startswith("blob://")
    out = g.invoke({"question": "big?", "images": [data_url]}, cfg)
    assert out["route"] == "speculative" and out["answer"] == "A"
    talk = chat(storage)
    ccfg = {"configurable": {"thread_id": "chat-5"}}
    for text, answer in [("tiny?", "B"), ("big?", "A")]:
        reply = talk.invoke(pasted_turn(data_url, text), ccfg)["messages"][-1]
        assert reply.content == answer
    human = talk.get_state(ccfg).values["messages"][0]
    # the pasted block, as a thumbnail naming its stored image
    assert human.content[1]["metadata"]["speceyes_image"].startswith("blob://")
    rows = saver_rows(storage[0])
    assert {r.channel for r in rows} >= {"images", "messages"}  # the input's rows are there
    assert not leaks(rows), describe(leaks(rows))
    assert max(r.size for r in rows) < 20_000, max(rows, key=lambda r: r.size)


def test_an_interrupted_run_resumes_where_it_stopped(storage, scene):
    """interrupt_before the agent loop (a human reviews the route, or a worker stops): the
    resumed run finishes from the checkpoint, without judging or drafting again."""
    g = build(storage, interrupt_before=["agent_loop"])
    cfg = {"configurable": {"thread_id": "t6"}}
    paused = g.invoke({"question": "tiny?", "images": [scene]}, cfg)
    assert paused.get("answer") is None and g.get_state(cfg).next == ("agent_loop",)
    done = g.invoke(None, cfg)
    assert done["route"] == "judged-agentic" and done["answer"] == "B"
    assert set(done["timings"]) >= {"judge", "agent"}
    again = g.invoke({"question": "big?", "images": [scene]}, cfg)  # the thread goes on clean
    assert again["route"] == "speculative" and again["agent_steps"] == []


def test_the_chat_graph_follow_up_on_another_worker(storage, scene):
    """Two graph instances with their own image stores over the same backends (two workers):
    a chat thread's follow-up on the second finds the image pasted on the first."""
    from langchain_core.messages import HumanMessage

    from speceyes_graph import create_speceyes_chat_graph
    from speceyes_tools import ImageStore

    checkpointer, store = storage
    if store is None:  # in-process backends: both "workers" share this process's store
        store = ImageStore()
    second_store = ImageStore(blobs=store.blobs)

    def chat(image_store):
        return create_speceyes_chat_graph(
            judge=judge(lambda q: "no" if "big" in q else "yes"),
            speculator=speculator("A", 9.0),
            agent=deepeyes_agent(answer="B"),
            store=image_store,
        ).compile(checkpointer=checkpointer)

    data = base64.b64encode(open(scene, "rb").read()).decode()
    pasted = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    cfg = {"configurable": {"thread_id": "chat-1"}}
    first = chat(store).invoke(
        {"messages": [HumanMessage(content=[{"type": "text", "text": "tiny?"}, pasted])]}, cfg
    )
    assert first["route"] == "judged-agentic" and first["messages"][-1].content == "B"
    second = chat(second_store).invoke({"messages": [HumanMessage(content="big?")]}, cfg)
    assert second["error"] is None and second["route"] == "speculative"
    assert [m.type for m in second["messages"]] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert second_store.cache.decodes == 1  # it decoded the pasted image from the shared blobs


@pytest.mark.postgres
def test_postgres_checkpoints_hold_references_not_pixels(postgres_dsn, tmp_path):
    """What the database holds after plain and chat runs with pasted images, agentic and
    speculative: no row of the checkpoint tables holds image data, decoded or as bytes; the
    images are in the blob table once each."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg_pool import ConnectionPool

    from speceyes_tools import ImageStore, PostgresBlobs

    scene = write_scene(tmp_path / "big.png", size=(2000, 1500), box=(100, 100, 300, 300))
    data_url = "data:image/png;base64," + base64.b64encode(open(scene, "rb").read()).decode()
    blobs = PostgresBlobs(postgres_dsn)
    with ConnectionPool(postgres_dsn, kwargs={"autocommit": True, "prepare_threshold": 0}) as pool:
        saver = PostgresSaver(pool)
        saver.setup()
        storage = (saver, ImageStore(blobs=blobs))
        g = build(storage)
        for i, (question, answer) in enumerate([("tiny?", "B"), ("big?", "A"), ("tiny?", "B")]):
            out = g.invoke(
                {"question": question, "images": [data_url]},
                {"configurable": {"thread_id": f"p{i}"}},
            )
            assert out["answer"] == answer
        talk = chat(storage)
        for text, answer in [("tiny?", "B"), ("big?", "A")]:
            turn = pasted_turn(data_url, text)
            reply = talk.invoke(turn, {"configurable": {"thread_id": "c"}})["messages"][-1]
            assert reply.content == answer
    with psycopg.connect(postgres_dsn) as conn:
        rows = list(postgres_rows(conn))
        stored = conn.execute("SELECT count(*), sum(size) FROM speceyes_blobs").fetchone()
    assert not leaks(rows), describe(leaks(rows))
    sizes = thread_sizes(rows)
    assert set(sizes) == {"p0", "p1", "p2", "c"}
    assert max(sum(tables.values()) for tables in sizes.values()) < 60_000, sizes
    # the pasted image once (four threads sent the same bytes), its model view, the crop
    assert stored[0] == 3 and stored[1] > len(open(scene, "rb").read())
    blobs.close()


@pytest.mark.postgres
def test_the_pixel_guard_finds_an_image_a_graph_keeps(postgres_dsn, scene):
    """The guard is not blind: a graph that keeps a pasted image in its state leaves it in
    every table's rows, and the guard reports each (a search of ``blob::text`` would not:
    Postgres prints ``bytea`` as hex)."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import START, StateGraph
    from psycopg_pool import ConnectionPool
    from typing_extensions import TypedDict

    class Keeps(TypedDict):
        images: list[str]
        answer: str

    keeps = StateGraph(Keeps)
    keeps.add_node("answer", lambda state: {"answer": "A"})
    keeps.add_edge(START, "answer")
    data_url = "data:image/png;base64," + base64.b64encode(open(scene, "rb").read()).decode()
    with ConnectionPool(postgres_dsn, kwargs={"autocommit": True, "prepare_threshold": 0}) as pool:
        saver = PostgresSaver(pool)
        saver.setup()
        keeps.compile(checkpointer=saver).invoke(
            {"images": [data_url]}, {"configurable": {"thread_id": "k"}}
        )
        found = {(r.table, r.channel) for r in leaks(saver_rows(saver))}
        memory = InMemorySaver()
        keeps.compile(checkpointer=memory).invoke(
            {"images": [data_url]}, {"configurable": {"thread_id": "k"}}
        )
        in_memory = {(r.table, r.channel) for r in leaks(saver_rows(memory))}
    expected = {
        ("checkpoint_blobs", "__start__"),  # LangGraph's record of the input
        ("checkpoint_blobs", "images"),
        ("checkpoint_writes", "images"),  # the input spread over the state's keys
    }
    assert found == expected and in_memory == expected
