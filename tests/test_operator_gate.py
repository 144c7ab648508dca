"""The shared gate is the operator's (issue 75), in process: a run sets only what the
deployment allows, and only runs under the deployment's settings teach the gate; a label is
an agent's verdict (an answer, or the agent being down), never a limit it was stopped at, a
failure of the query's own or a run stopped before it; a query the judge sent to the tools
counts once its agent answered; and no one source holds more than its share of the window.
The same attacks through ``langgraph dev`` and Aegra, as a client sends them, are in
``tests/test_server.py`` and ``tests/test_aegra.py``."""

from __future__ import annotations

import itertools

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from test_online_graph import KEY, agent, build, entries, query

from speceyes_graph.agents.loop import LoopOptions
from speceyes_graph.gate.keys import GateKeys
from speceyes_graph.gate.ledger import MemoryLedger, Observation, StoreLedger
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from speceyes_graph.graph.nodes import SpecEyesError
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.settings import SERVED_CLIENT_SETTINGS, Limits, RunSettings

RUNS = itertools.count()
EVERYTHING = frozenset(RunSettings.__dataclass_fields__)


def served(identity: str | None = None) -> dict:
    """A run's config as a server gives it: a run id, and the caller's identity."""
    configurable: dict = {"run_id": f"run-{next(RUNS)}", "thread_id": "t"}
    if identity is not None:
        configurable["langgraph_auth_user"] = {"identity": identity}
    return {"configurable": configurable}


def guarded(**trust) -> OnlineGate:
    """A gate at tau 0.98 that does not move: a draft at separability 5 (0.95) is rejected
    and labelled by the agent, one at 9 (0.9955) accepted and always shadowed."""
    return OnlineGate(
        0.05,
        1.0,
        tau=0.98,
        risk=RiskOptions(window=100, warmup=100),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(**trust),
    )


def zooms_forever() -> ScriptedChatModel:
    """An agent that never answers: every turn is a crop (DeepEyes text)."""
    call = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 20, 20]}}'
    return ScriptedChatModel(respond=lambda msgs: f"<think>look</think>{call}</tool_call>")


# --- what a run may set ------------------------------------------------------------------------


def test_a_run_may_set_only_what_the_deployment_allows(scene):
    graph = build(
        agent("A"), None, limits=Limits(client_settings=SERVED_CLIENT_SETTINGS), on_error="record"
    ).compile()
    for context in ({"tau": 0.0}, {"mode": "small"}, {"k": 2}, {"model_timeout_s": 0.001}):
        out = graph.invoke(query(scene, 0), context=context)
        assert out["answer"] is None and "does not let a run set" in out["error"], context
        assert "a run may set: on_error" in out["error"]
    out = graph.invoke(query(scene, 0, 5.0), context={"on_error": "record"})
    assert out["answer"] == "A" and not out.get("error")
    # through configurable (older clients, an assistant's config) just the same
    strict = build(
        agent("A"), None, limits=Limits(client_settings=frozenset()), on_error="raise"
    ).compile()
    with pytest.raises(SpecEyesError, match="does not let a run set tau"):
        strict.invoke(query(scene, 0), {"configurable": {"tau": 0.0}})


def test_a_graph_you_run_yourself_takes_every_setting(scene):
    graph = build(agent("B"), None).compile()
    assert graph.invoke(query(scene, 0, 5.0), context={"tau": 0.5})["route"] == "speculative"
    assert graph.invoke(query(scene, 0, 9.0), context={"mode": "agent"})["answer"] == "B"


def test_an_unknown_setting_name_is_refused_when_the_graph_is_built():
    with pytest.raises(ValueError, match="names no setting"):
        Limits(client_settings={"tau", "temperature"})


def test_runs_under_other_settings_never_teach_the_gate(scene):
    """Allowed or not, a run whose settings differ from the deployment's (other than how a
    failure is reported) takes no decision, writes no entry and runs no shadow."""
    gate = guarded()
    graph = build(agent("B"), gate, limits=Limits(client_settings=EVERYTHING)).compile()
    for context in ({"k": 2}, {"max_agent_steps": 1}, {"model_timeout_s": 100.0},
                    {"aggregation": "mean"}, {"tau": 0.5}):  # fmt: skip
        for sep in (5.0, 9.0):
            out = graph.invoke(query(scene, 0, sep), served(), context=context)
            assert out["answer"], (context, out.get("error"))
    assert entries(gate) == [] and gate.shadows.stats()["started"] == 0
    graph.invoke(query(scene, 0, 5.0), served(), context={"on_error": "record"})
    [observation] = entries(gate)
    assert observation.disagrees is True  # the agent said B: a label, under its settings


# --- a label is an agent's verdict -------------------------------------------------------------


def test_an_agent_stopped_at_its_step_limit_gives_no_label(scene):
    gate = guarded()
    graph = build(zooms_forever(), gate, loop=LoopOptions(max_steps=1)).compile()
    out = graph.invoke(query(scene, 0, 5.0), served())
    assert out["route"] == "rejected-agentic" and "step_limit" in out["stop_reason"]
    [pending] = entries(gate)
    assert pending.disagrees is None and not pending.failed
    assert gate.counts["window"] == 0  # pending: never counted against the draft


def test_an_agent_that_is_down_counts_as_disagreeing_and_its_own_failure_does_not(scene):
    gate = guarded()
    down = ScriptedChatModel(respond=lambda m: (_ for _ in ()).throw(ConnectionError("down")))
    build(down, gate, on_error="record").compile().invoke(query(scene, 0, 5.0), served())
    [observation] = entries(gate)
    assert observation.disagrees is True and observation.failed
    own = ScriptedChatModel(respond=lambda m: (_ for _ in ()).throw(ValueError("bad input")))
    gate = guarded()
    build(own, gate, on_error="record").compile().invoke(query(scene, 0, 5.0), served())
    [observation] = entries(gate)
    assert observation.disagrees is None and not observation.failed


def test_a_query_sent_to_the_tools_counts_once_its_agent_answered(scene):
    gate = guarded()
    graph = build(agent("A"), gate, judge_rule="yes").compile(
        checkpointer=InMemorySaver(), interrupt_before=["agent_loop"]
    )
    stopped = {"configurable": {**served()["configurable"], "thread_id": "stopped"}}
    graph.invoke(query(scene, 0), stopped)  # interrupted before its agent: never counted
    assert entries(gate) == []
    answered = {"configurable": {**served()["configurable"], "thread_id": "answered"}}
    graph.invoke(query(scene, 1), answered)
    graph.invoke(None, answered)  # resumed: the agent answers
    [observation] = entries(gate)
    assert observation.score is None and observation.disagrees is None


def test_a_rejected_draft_interrupted_before_its_agent_is_never_counted(scene):
    gate = guarded()
    graph = build(agent("B"), gate).compile(
        checkpointer=InMemorySaver(), interrupt_before=["agent_loop"]
    )
    for i in range(5):
        config = {"configurable": {**served()["configurable"], "thread_id": f"t{i}"}}
        graph.invoke(query(scene, i, 5.0), config)
    assert len(entries(gate)) == 5 and all(o.disagrees is None for o in entries(gate))
    assert gate.counts["window"] == 0


# --- no one source holds more than its share -----------------------------------------------------


def obs(at: float, source: str) -> Observation:
    return Observation(at, 0.99, False, False, False, source=source)


def test_a_source_past_its_share_replaces_its_own_oldest():
    ledger = MemoryLedger(10, cap=3)
    for i in range(20):
        ledger.record(f"m{i}", obs(100 + i, "mallory"))
    ledger.record("a", obs(200, "alice"))
    ledger.record("b", obs(201, "bob"))
    kept = ledger.recent()
    assert [o.source for o in kept].count("mallory") == 3
    assert [o.at for o in kept if o.source == "mallory"] == [117, 118, 119]  # her newest
    unlimited = MemoryLedger(10, cap=3)  # in one process: no source, never capped
    for i in range(20):
        unlimited.record(f"q{i}", obs(100 + i, ""))
    assert len(unlimited.recent()) == 10


def test_a_shared_window_keeps_each_sources_share_and_prunes_the_rest():
    store, keys = InMemoryStore(), GateKeys(KEY)
    writer, reader = (StoreLedger(store, ("t", "share"), 10, keys, sync_s=0.0) for _ in "ab")
    for i in range(8):
        writer.record(f"m{i}", obs(100 + i, "mallory"))
    writer.record("a", obs(200, "alice"))
    capped = StoreLedger(store, ("t", "share"), 10, keys, sync_s=0.0, cap=3)
    capped.sync()
    assert sorted(o.source for o in capped.recent()) == ["alice"] + ["mallory"] * 3
    held = [
        i for i in store.search(("t", "share"), limit=100) if tuple(i.namespace) == ("t", "share")
    ]
    assert len(held) == 4  # the rest pruned
    reader.sync()
    assert len(reader.recent()) == 4


def test_whose_share_a_query_counts_in(scene):
    gate = guarded(max_share=0.1)  # a window of 100: at most 10 of any one source's
    graph = build(agent("A"), gate, judge_rule="yes").compile()
    for i in range(30):
        graph.invoke(query(scene, i), served("mallory"))
    for i in range(5):
        graph.invoke(query(scene, i), served("alice"))
    sources = [o.source for o in entries(gate)]
    assert len(sources) == 15 and len(set(sources)) == 2
    assert all(s.startswith("id:") and "mallory" not in s for s in sources)  # a digest
    assert gate.source("anonymous", served=True, at=125.0) == "~2"  # an open server: bursts
    assert gate.source(None, served=True, at=59.0) == "~0"
    assert gate.source("alice", served=False) == ""  # in one process: nobody's
    in_process = guarded(max_share=0.1)
    graph = build(agent("A"), in_process, judge_rule="yes").compile()
    graph.batch([query(scene, i) for i in range(30)])
    assert len(entries(in_process)) == 30
