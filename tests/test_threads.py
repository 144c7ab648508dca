"""Runs on a reused thread start clean, with in-memory and SQLite checkpointers, and the
state never holds pixels."""

import base64
import json
import sqlite3

import pytest
from conftest import write_scene
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_graph.state import SpecEyesOutput

OUTPUT_KEYS = set(SpecEyesOutput.__annotations__)


@pytest.fixture(params=["memory", "sqlite"])
def saver(request, tmp_path):
    if request.param == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


def build(saver, **kw):
    # "big" questions are judged tool-free and drafted confidently; others go to the agent
    return create_speceyes_graph(
        judge=judge(lambda q: "no" if "big" in q else "yes"),
        speculator=speculator("A", 9.0),
        agent=deepeyes_agent(answer="B"),
        **kw,
    ).compile(checkpointer=saver)


def fresh(saver, inputs):
    """What the same query returns on a brand-new thread: the reference for every key."""
    return build(saver).invoke(inputs, {"configurable": {"thread_id": f"fresh-{id(inputs)}"}})


def same_outputs(a, b):
    drop = {"timings"}  # wall times differ run to run; their keys are compared separately
    return {k: a.get(k) for k in OUTPUT_KEYS - drop} == {k: b.get(k) for k in OUTPUT_KEYS - drop}


def test_bad_query_then_good_query_on_one_thread(saver, scene):
    g = build(saver)
    cfg = {"configurable": {"thread_id": "t1"}}
    bad = g.invoke({"question": "big?", "images": ["/no/such/image.png"]}, cfg)
    assert bad["error"].startswith("input: ") and bad["answer"] is None
    good_input = {"question": "big?", "images": [scene], "options": ["red", "blue"]}
    good = g.invoke(good_input, cfg)
    assert good["error"] is None and good["route"] == "speculative" and good["answer"] == "A"
    assert same_outputs(good, fresh(saver, good_input))
    assert set(good["timings"]) == {"intake", "judge", "speculate"}


def test_agentic_then_speculative_then_agentic(saver, scene):
    g = build(saver)
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
    assert same_outputs(second, fresh(saver, second_input))
    third = g.invoke({"question": "tiny?", "images": [scene]}, cfg)
    assert third["draft"] is None and len(third["agent_steps"]) == 2  # no stale draft either


def test_inputs_are_not_inherited_by_later_runs(saver, scene, tmp_path):
    g = build(saver)
    cfg = {"configurable": {"thread_id": "t3"}}
    g.invoke({"question": "big?", "images": [scene], "options": ["red", "blue"]}, cfg)
    # no images and no options this time: the earlier ones must not be used
    out = g.invoke({"question": "tiny?"}, cfg)
    query = g.get_state(cfg).values["query"]
    assert query["images"] == [] and query["options"] is None
    assert out["route"] == "judged-agentic"
    assert "no image is attached" in out["agent_steps"][0]["tool_calls"][0]["error"]


def test_a_failed_run_does_not_poison_the_thread_in_raise_mode(saver, scene):
    from speceyes_graph import SpecEyesError

    g = build(saver, on_error="raise")
    cfg = {"configurable": {"thread_id": "t4"}}
    with pytest.raises(SpecEyesError, match="image file not found"):
        g.invoke({"question": "big?", "images": ["/no/such.png"]}, cfg)
    out = g.invoke({"question": "big?", "images": [scene]}, cfg)
    assert out["error"] is None and out["route"] == "speculative"


def test_state_and_checkpoints_hold_no_pixels(saver, tmp_path):
    scene = write_scene(tmp_path / "big.png", size=(2000, 1500), box=(100, 100, 300, 300))
    data_url = "data:image/png;base64," + base64.b64encode(open(scene, "rb").read()).decode()
    g = build(saver)
    cfg = {"configurable": {"thread_id": "t5"}}
    out = g.invoke({"question": "tiny?", "images": [data_url]}, cfg)
    assert out["route"] == "judged-agentic" and out["answer"] == "B"
    # the crop came back as a reference, and the input became one
    tool_msg = next(m for m in out["agent_messages"] if m.type == "tool")
    refs = [b["url"] for b in tool_msg.content if isinstance(b, dict) and b.get("type") == "image"]
    assert len(refs) == 1 and refs[0].startswith("blob://")
    values = g.get_state(cfg).values
    assert values["query"]["images"][0].startswith("blob://")
    dumped = json.dumps(
        values, default=lambda o: o.model_dump() if hasattr(o, "model_dump") else str(o)
    )
    assert "base64" not in dumped and "data:image" not in dumped and "iVBOR" not in dumped
    # every checkpoint after the input one is small (the input checkpoint holds the run's
    # input as sent: LangGraph's record of the run)
    history = list(g.get_state_history(cfg))
    later = [h for h in history if h.metadata.get("source") != "input"]
    sizes = [len(json.dumps(h.values, default=str)) for h in later]
    assert max(sizes) < 20_000, sizes
