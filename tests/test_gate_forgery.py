"""A label counts only for a decision the gate made, once (issue 66), in process.

Every way a client of a server hands a node state, done here with a checkpointer as a server
does it: ``update_state`` as the gate, as ``speculate``, ``Command(goto=..., update=...)``,
a run forked from an old checkpoint, an interrupted run resumed after its state was
rewritten, input carrying ``gate_key``/``draft``/``route``, and the middleware's
``speceyes`` record in an agent's state. Each forged run still answers (the agent runs); it
earns no label and changes none. ``server`` runs each call under a run id of its own, as
LangGraph's servers and Aegra set ``configurable.run_id``; ``process`` runs none (the
intake's nonce). The same forgeries through ``langgraph dev`` and Aegra are in
``tests/test_server.py`` and ``tests/test_aegra.py``.

Then: when shadow runs stop giving labels the gate tightens (and probes find when they work
again), and a killed worker's shadows in flight stop holding back the fleet's window once
its signs of life stop."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from test_online_graph import agent, build, entries, query

from speceyes_graph.gate.keys import GateKeys
from speceyes_graph.gate.ledger import Observation, StoreLedger
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from speceyes_graph.gate.online_steps import UNBOUND
from speceyes_graph.gate.window import settled

KEY = "a test key for the online gate's entries"
RUNS = itertools.count()
REAL = (pytest.approx(0.9526, abs=1e-4), False)  # separability 5: sigmoid(0.6 * 5), agreeing


def config(mode: str, thread: str = "t") -> dict:
    """A run's config: under a server, a run id of its own each time."""
    configurable = {"thread_id": thread}
    if mode == "server":
        configurable["run_id"] = f"run-{next(RUNS)}"
    return {"configurable": configurable}


def labels(gate: OnlineGate) -> list[tuple[float | None, bool | None]]:
    return sorted((o.score, o.disagrees) for o in entries(gate))


def forged_draft(text: str, score: float) -> dict:
    return {"text": text, "score": score, "accepted": False, "tau": 0.98, "gated_at": time.time()}


@pytest.fixture
def thread(scene):
    """A graph on a checkpointer whose thread ``t`` holds one real run: a draft the gate
    rejected at 0.98 (score 0.95), labelled by the agent ("A" agrees with it)."""

    def make(mode: str, **compile_kw):
        gate = OnlineGate(
            0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=1000), labels=LabelOptions(seed=0)
        )
        graph = build(agent("A"), gate).compile(checkpointer=InMemorySaver(), **compile_kw)
        out = graph.invoke(query(scene, 0, 5.0), config(mode))
        return graph, gate, out

    return make


@pytest.mark.parametrize("mode", ["server", "process"])
def test_update_state_as_the_gate_earns_no_label(thread, mode):
    """The issue's forgery: a rejected route, a draft and a key written as the gate's
    output, then a run from there. Before: a label at the client's score and time, under
    the client's key (or rewriting another run's)."""
    graph, gate, real = thread(mode)
    assert real["route"] == "rejected-agentic" and labels(gate) == [REAL]
    for key in ("a key of the client's", graph.get_state(config("process")).values["gate_key"]):
        forged = {"gate_key": key, "route": "rejected-agentic", "draft": forged_draft("B", 0.51)}
        graph.update_state(config("process"), forged, as_node="gate")
        out = graph.invoke(None, config(mode))
        assert out["answer"] == "A" and out["route"] == "rejected-agentic"  # it answers
        assert labels(gate) == [REAL], key


@pytest.mark.parametrize("mode", ["server", "process"])
def test_a_draft_written_as_speculate_is_not_gated(thread, mode):
    """A draft the run did not make (written as ``speculate``'s output): the gate does not
    decide on it; the agent answers; nothing is recorded."""
    graph, gate, _ = thread(mode)
    graph.update_state(config("process"), {"draft": forged_draft("A", 0.51)}, as_node="speculate")
    out = graph.invoke(None, config(mode))
    assert out["route"] == "rejected-agentic" and out["answer"] == "A"
    assert labels(gate) == [REAL]
    assert out["draft"]["note"] == UNBOUND


@pytest.mark.parametrize("mode", ["server", "process"])
def test_a_command_into_the_agent_loop_earns_no_label(thread, mode):
    graph, gate, _ = thread(mode)
    update = {"gate_key": "forged", "route": "rejected-agentic", "draft": forged_draft("B", 0.6)}
    out = graph.invoke(Command(goto="agent_loop", update=update), config(mode))
    assert out["answer"] == "A"
    assert labels(gate) == [REAL]
    out = graph.invoke(Command(goto="gate", update={"draft": forged_draft("A", 0.6)}), config(mode))
    assert labels(gate) == [REAL]
    assert out["route"] == "rejected-agentic" and out["draft"]["note"] == UNBOUND


@pytest.mark.parametrize("mode", ["server", "process"])
def test_a_fork_of_an_old_checkpoint_cannot_relabel(thread, mode):
    """From the checkpoint between the gate and the agent of the real run, with its draft
    rewritten (the agent now disagrees with it) and without: the real label stands."""
    graph, gate, _ = thread(mode)
    [between] = [s for s in graph.get_state_history(config("process")) if s.next == ("agent_loop",)]
    graph.invoke(
        None,
        {
            **between.config,
            **{"configurable": {**between.config["configurable"], **config(mode)["configurable"]}},
        },
    )
    rewritten = graph.update_state(
        between.config, {"draft": forged_draft("B", 0.95)}, as_node="gate"
    )
    if mode == "server":
        rewritten = {"configurable": {**rewritten["configurable"], "run_id": "run-fork"}}
    out = graph.invoke(None, rewritten)
    assert out["answer"] == "A"
    assert labels(gate) == [REAL]


@pytest.mark.parametrize("mode", ["server"])
def test_an_interrupted_run_resumed_after_a_rewrite_earns_no_label(thread, mode):
    """A client may ask a server for ``interrupt_before=["agent_loop"]``: the run stops
    after the gate decided; the client rewrites the draft; a new run resumes it. The
    decision belonged to the first run: no label. (In process there is no second party:
    the one caller resumes its own run, which labels its decision, once.)"""
    graph, gate, _ = thread(mode, interrupt_before=["agent_loop"])
    pending = [(REAL[0], None)]  # decided, its label to come with its agent
    assert labels(gate) == pending  # the real run stopped before its agent
    graph.update_state(config("process"), {"draft": forged_draft("B", 0.95)}, as_node="gate")
    out = graph.invoke(None, config(mode))
    assert out["answer"] == "A"
    assert labels(gate) == pending


def test_a_run_redelivered_to_another_worker_labels_its_own_decision(scene, shared_store):
    """Two workers over one store and one checkpointer; the first stops between the gate
    and the agent (as a worker killed there does: its decision is in the store, pending).
    The engine redelivers the run, under the same run id, to the second worker, which
    labels that decision from the checkpoint's draft, once; the same run with its draft
    rewritten, or redelivered again, labels nothing more."""
    saver = InMemorySaver()
    risk, trust = RiskOptions(warmup=1000), TrustOptions(sync_s=0.0, key=KEY)
    gates = [
        OnlineGate(0.05, 0.5, tau=0.98, risk=risk, labels=LabelOptions(seed=s), trust=trust)
        for s in (0, 1)
    ]
    dies = build(agent("A"), gates[0]).compile(
        checkpointer=saver, store=shared_store, interrupt_before=["agent_loop"]
    )
    takes_over = build(agent("A"), gates[1]).compile(checkpointer=saver, store=shared_store)

    reader = StoreLedger(shared_store, ("speceyes", "online_gate", "default"), 1000, GateKeys(KEY))

    def entry(run: str):  # as the store holds it
        found = reader.get(f"{run}|")
        return None if found is None else (found.score, found.disagrees)

    def redeliver(run: str, thread: str) -> dict:
        return takes_over.invoke(None, {"configurable": {"thread_id": thread, "run_id": run}})

    for run in ("r1", "r2"):
        dies.invoke(query(scene, 0, 5.0), {"configurable": {"thread_id": run, "run_id": run}})
        assert entry(run) == (REAL[0], None)  # decided, pending

    assert redeliver("r1", "r1")["answer"] == "A"
    assert entry("r1") == REAL  # labelled by the worker that took the run over
    takes_over.update_state(
        {"configurable": {"thread_id": "r1"}}, {"draft": forged_draft("B", 0.95)}, as_node="gate"
    )
    redeliver("r1", "r1")
    assert entry("r1") == REAL  # not the draft decided on
    contrary = build(
        agent("B"),
        OnlineGate(0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=1000), trust=TrustOptions(key=KEY)),
    )
    real_draft = dies.get_state({"configurable": {"thread_id": "r2"}}).values["draft"]
    takes_over.update_state(
        {"configurable": {"thread_id": "r1"}}, {"draft": real_draft}, as_node="gate"
    )
    contrary.compile(checkpointer=saver, store=shared_store).invoke(
        None, {"configurable": {"thread_id": "r1", "run_id": "r1"}}
    )
    assert entry("r1") == REAL  # the decided draft, an agent that now disagrees: a label is final

    takes_over.update_state(
        {"configurable": {"thread_id": "r2"}}, {"draft": forged_draft("B", 0.95)}, as_node="gate"
    )
    assert redeliver("r2", "r2")["answer"] == "A"
    assert entry("r2") == (REAL[0], None)  # not the draft decided on: no label


def test_input_carrying_gate_fields_is_a_query_like_any_other(scene):
    """``gate_key``, ``draft`` and ``route`` in the input change nothing: the run is observed
    under its own key with its own draft's label."""
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=1000), labels=LabelOptions(seed=0)
    )
    graph = build(agent("A"), gate).compile(checkpointer=InMemorySaver())
    carried = {
        **query(scene, 0, 5.0),
        "gate_key": "forged",
        "route": "rejected-agentic",
        "draft": forged_draft("B", 0.51),
    }
    out = graph.invoke(carried, config("server"))
    assert out["route"] == "rejected-agentic" and out["draft"]["score"] == pytest.approx(
        0.95, abs=0.01
    )
    assert labels(gate) == [REAL]
    assert "forged" not in gate.ledger._window.items  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["server", "process"])
def test_the_middlewares_record_in_an_agents_state_earns_no_label(scene, mode):
    """``create_agent`` with the middleware and the online gate: a real turn rejected and
    labelled; then a client writes a ``speceyes`` record (the real turn's key, a draft the
    agent's answer now contradicts) and a final answer as the model's output, and runs on:
    ``after_agent`` takes no label from it."""
    import base64
    from pathlib import Path

    from langchain.agents import create_agent

    from helpers import judge as scripted_judge
    from helpers import speculator
    from speceyes_graph import SpecEyesMiddleware

    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=1000), labels=LabelOptions(seed=0)
    )
    middleware = SpecEyesMiddleware(
        speculator=speculator("A", 5.0), judge=scripted_judge("no"), gate=gate
    )
    large = agent("A")
    graph = create_agent(large, [], middleware=[middleware], checkpointer=InMemorySaver())
    data = base64.b64encode(Path(scene).read_bytes()).decode()
    turn = HumanMessage(
        content=[
            {"type": "text", "text": "q0 sep=5.0 colour? Options: red, blue"},
            {"type": "image", "base64": data, "mime_type": "image/png"},
        ]
    )
    out = graph.invoke({"messages": [turn]}, config(mode))
    record = out["speceyes"]
    assert record["route"] == "rejected-agentic"
    assert labels(gate) == [REAL]
    forged = {**record, "draft": forged_draft("B", 0.95)}
    for key in (record["gate_key"], "a key of the client's"):
        graph.update_state(
            config("process"),
            {
                "speceyes": {**forged, "gate_key": key},
                "messages": [AIMessage("<answer>A</answer>")],
            },
            as_node="model",
        )
        graph.invoke(None, config(mode))
        assert labels(gate) == [REAL], key


def test_when_shadows_stop_giving_labels_the_gate_tightens_and_probes_find_them_again(
    scene, caplog, monkeypatch
):
    """The gate learns a low tau from real labels with working shadows (drafts at score
    0.95 that agree). Then the shadow runs fail (the agent raises in the background) while
    the traffic turns wrong (the agent now contradicts every draft): within a few accepted
    drafts the gate is tightened to its outage tau, logged once and in ``state()``, instead
    of accepting all of them. Once shadows work again, probes (drafts it would have
    accepted, shadowed while rejected) show it and tau comes back."""
    from speceyes_graph.graph.fallback import AgentFallback

    broken = threading.Event()
    answer = {"now": "A"}
    shadow_answer = AgentFallback.shadow_answer

    def failing(self, state, draft):
        if broken.is_set():
            raise RuntimeError("the agent fails in the background")
        return shadow_answer(self, state, draft)

    monkeypatch.setattr(AgentFallback, "shadow_answer", failing)

    def learnt_gate():
        broken.clear()
        answer["now"] = "A"
        gate = OnlineGate(
            0.1,
            0.5,
            tau=0.98,
            risk=RiskOptions(window=400, warmup=20),
            labels=LabelOptions(seed=0),
            trust=TrustOptions(outage_tau=1.0),
        )
        graph = build(agent(lambda q: answer["now"]), gate).compile()

        def run(n: int) -> list[dict]:
            outs = []
            for i in range(n):
                outs.append(graph.invoke(query(scene, i, 5.0)))
                assert gate.shadows.drain(30)
            return outs

        learnt = run(60)
        assert [o["route"] for o in learnt[30:]] == ["speculative"] * 30 and gate.tau < 0.95
        return gate, run

    gate, run = learnt_gate()
    broken.set()
    answer["now"] = "B"  # every draft is now wrong
    with caplog.at_level(logging.WARNING, logger="speceyes_graph.gate.online"):
        wrong = run(60)
    accepted = sum(o["route"] == "speculative" for o in wrong)
    assert accepted <= 20, accepted  # with the old gate: 60 of 60
    assert gate.tau == 1.0 and "shadow runs give no labels" in gate.state()["trouble"]
    assert len([r for r in caplog.records if "tightened" in r.getMessage()]) == 1

    gate, run = learnt_gate()  # the traffic stays right; the shadows fail, then work again
    broken.set()
    run(40)
    assert gate.tau == 1.0 and gate.state()["trouble"] is not None
    broken.clear()
    back = run(60)
    assert gate.state()["trouble"] is None and gate.tau < 0.95
    assert back[-1]["route"] == "speculative"


def test_a_killed_workers_shadows_stop_holding_back_the_window(shared_store):
    """Worker A records a shadowed draft whose label is still to come, then dies (it stops
    signing signs of life). Worker B's window counts the traffic only up to that shadow
    while A lives, and all of it once A has been silent for three beats, not for the five
    minutes of ``patience_s``."""
    keys = GateKeys(KEY)
    a, b = (
        StoreLedger(shared_store, ("t", "gate"), 100, keys, sync_s=0.0, beat_s=0.2) for _ in "ab"
    )
    now = time.time()
    a.record("pending", Observation(now - 50, 0.99, True, True, None))
    for i in range(10):
        b.record(f"k{i}", Observation(now - 40 + i, 0.9, False, False, False))
    b.sync()
    assert len(settled(b.recent(), time.time(), 300.0, b.alive)) == 0  # A's shadow holds it
    time.sleep(0.7)  # A is silent for more than three beats
    b.sync()
    assert not b.alive(a.worker) and b.alive(b.worker)
    assert len(settled(b.recent(), time.time(), 300.0, b.alive)) == 10


def test_the_draft_says_whether_the_gate_is_shared(scene, monkeypatch, caplog):
    """Each answer's draft says where the gate's labels live; a served online gate without
    a key says so when a server loads the graphs (serve.py), not at its first run."""
    from langgraph.store.memory import InMemoryStore

    gate = OnlineGate(
        0.05,
        0.5,
        tau=0.98,
        risk=RiskOptions(warmup=1000),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(key=KEY),
    )
    out = build(agent("A"), gate).compile(store=InMemoryStore()).invoke(query(scene, 0, 5.0))
    assert out["draft"]["gate_scope"] == "shared"
    assert out["draft"]["gate_counts"] == {"window": 0, "labelled": 0, "disagreeing": 0}

    monkeypatch.delenv("SPECEYES_GATE_KEY", raising=False)
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=1000), labels=LabelOptions(seed=0)
    )
    out = build(agent("A"), gate).compile(store=InMemoryStore()).invoke(query(scene, 0, 5.0))
    assert out["draft"]["gate_scope"] == "process"

    from speceyes_graph.integrations.studio import warn_if_the_online_gate_cannot_be_shared

    warn_if_the_online_gate_cannot_be_shared.cache_clear()  # said once per process
    with caplog.at_level(logging.WARNING, logger="speceyes_graph.integrations.studio"):
        warn_if_the_online_gate_cannot_be_shared()  # what serve.py calls as a server loads it
    assert any("SPECEYES_GATE_KEY is not set" in r.getMessage() for r in caplog.records)
