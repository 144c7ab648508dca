"""The online gate in the graph (``create_speceyes_graph(gate=OnlineGate(...))``): each query
records the tau it met and whether it was shadowed; rejected drafts are labelled by the
agent's answer and shadowed ones by a shadow run that never delays the answer (bounded,
counted, a failure loses only its label); the gate's state is shared by every worker
through a LangGraph store (in memory, and PostgreSQL), a redelivered run is observed once,
and tau moves on the labels: up when accepted drafts disagree with the agent, down when
they agree. Scripted models: the drafts' scores and the agent's answers are chosen."""

from __future__ import annotations

import re
import threading

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

from helpers import judge, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.protocol import message_text

OPTIONS = ["red", "blue"]
KEY = "a test key for the online gate's entries"


def query(scene, i: int, sep: float = 9.0) -> dict:
    """Question i; its draft scores ``sep`` (the speculator reads it from the question)."""
    return {"question": f"q{i} sep={sep} colour?", "images": [scene], "options": OPTIONS}


def number(question: str) -> int:
    return int(re.search(r"\bq(\d+) ", question).group(1))


def sep_of(question: str) -> float:
    return float(question.split("sep=")[1].split()[0])


def agent(answer="A", gate: threading.Event | None = None, fail: bool = False):
    """Answers at once (DeepEyes text); ``answer`` may be a function of the question;
    ``gate``: each call waits for it; ``fail``: each call raises."""

    def respond(msgs):
        if gate is not None:
            assert gate.wait(30)
        if fail:
            raise ConnectionError("the agent's server is down")
        q = "".join(message_text(m) for m in msgs if m.type == "human")
        said = answer(q) if callable(answer) else answer
        return f"<think>ok</think><answer>{said}</answer>"

    return ScriptedChatModel(respond=respond)


def build(agent_model, online, judge_rule="no", draft="A", **kw):
    return create_speceyes_graph(
        judge=judge(judge_rule),
        speculator=speculator(draft, lambda q: sep_of(q)),
        agent=agent_model,
        gate=online,
        **kw,
    )


def entries(gate: OnlineGate):
    return gate.ledger.recent()


def test_each_query_records_its_tau_and_shadow_and_every_label_comes_back(scene):
    """Drafts at separability 9 (score 0.9955 > 0.98: accepted) and 5 (0.95: rejected); the
    agent agrees with even questions' drafts. Every query is observed once; rejected ones
    carry the agent's verdict, shadowed ones the shadow run's, the rest no label."""
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(window=1000, warmup=1000), labels=LabelOptions(seed=1)
    )  # tau stays at 0.98
    graph = build(agent(lambda q: "A" if number(q) % 2 == 0 else "B"), gate).compile()
    qs = [query(scene, i, 9.0 if i < 30 else 5.0) for i in range(40)]
    outs = graph.batch(qs, {"max_concurrency": 1})  # in order: entries follow the queries
    assert gate.shadows.drain(30)
    routes = [o["route"] for o in outs]
    assert routes == ["speculative"] * 30 + ["rejected-agentic"] * 10
    assert all(o["draft"]["tau"] == 0.98 for o in outs)
    shadowed = [i for i, o in enumerate(outs) if o["draft"]["shadowed"]]
    assert 5 <= len(shadowed) <= 25 and all(i < 30 for i in shadowed)  # accepted ones only
    seen = entries(gate)
    assert len(seen) == 40  # one entry per query, labels replacing their query's entry
    for i, obs in enumerate(sorted(seen, key=lambda o: o.at)):
        disagrees = i % 2 == 1
        if i >= 30:
            assert not obs.accepted and obs.disagrees is disagrees, (i, obs)
        elif i in shadowed:
            assert obs.shadowed and obs.disagrees is disagrees, (i, obs)
        else:
            assert obs.disagrees is None, (i, obs)
    stats = gate.state()["shadow_runs"]
    assert stats["started"] == stats["labelled"] == len(shadowed) and stats["seconds"] > 0


def test_a_shadow_run_never_delays_the_answer(scene):
    """The agent blocks until released: the accepted draft's answer returns while its shadow
    run is still waiting on the agent; the label lands once it is released."""
    release = threading.Event()
    gate = OnlineGate(
        0.05, 1.0, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    graph = build(agent("A", gate=release), gate).compile()
    out = graph.invoke(query(scene, 0))
    assert out["route"] == "speculative" and out["answer"] == "A" and out["draft"]["shadowed"]
    assert gate.shadows.stats()["running"] == 1
    [pending] = entries(gate)
    assert pending.accepted and pending.disagrees is None
    release.set()
    assert gate.shadows.drain(30)
    [labelled] = entries(gate)
    assert labelled.disagrees is False and labelled.at == pending.at


def test_a_failed_or_dropped_shadow_loses_only_its_label(scene):
    """One shadow at a time and no queue: with the first shadow blocked, the next two are
    dropped (counted); a failing agent fails its shadow. Every answer stands."""
    release = threading.Event()
    gate = OnlineGate(
        0.05,
        1.0,
        tau=0.98,
        risk=RiskOptions(warmup=100),
        labels=LabelOptions(concurrency=1, queue=0, seed=0),
    )
    graph = build(agent("A", gate=release), gate).compile()
    outs = [graph.invoke(query(scene, i)) for i in range(3)]
    assert [o["answer"] for o in outs] == ["A"] * 3
    assert gate.shadows.stats()["dropped"] == 2
    release.set()
    assert gate.shadows.drain(30)
    assert [o.disagrees for o in entries(gate)] == [False, None, None]

    gate = OnlineGate(
        0.05, 1.0, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    out = build(agent(fail=True), gate).compile().invoke(query(scene, 0))
    assert out["answer"] == "A" and out["error"] is None
    assert gate.shadows.drain(30)
    assert gate.shadows.stats()["failed"] == 1 and entries(gate)[0].disagrees is None


def in_order(graph, gate: OnlineGate, queries: list[dict]) -> list[dict]:
    """One query at a time, each after the last one's shadow run has ended: every decision
    sees every label before it, however loaded the machine."""
    outs = []
    for q in queries:
        outs.append(graph.invoke(q))
        assert gate.shadows.drain(30)
    return outs


def test_tau_moves_up_when_drafts_disagree_and_down_when_they_agree(scene):
    """Confident drafts (0.9955) the agent contradicts: the gate stops accepting them.
    Drafts at 0.95 (below the published 0.98) the agent confirms: it starts accepting them."""
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(window=200, warmup=20), labels=LabelOptions(seed=0)
    )
    graph = build(agent("B"), gate).compile()
    outs = in_order(graph, gate, [query(scene, i, 9.0) for i in range(60)])
    assert gate.tau > 0.9955
    assert [o["route"] for o in outs[30:]] == ["rejected-agentic"] * 30

    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(window=200, warmup=20), labels=LabelOptions(seed=0)
    )
    graph = build(agent("A"), gate).compile()
    outs = in_order(graph, gate, [query(scene, i, 5.0) for i in range(80)])
    routes = [o["route"] for o in outs]
    assert routes[:20] == ["rejected-agentic"] * 20  # it started at the published 0.98
    assert routes[40:].count("speculative") >= 10  # then accepted many
    assert min(o["draft"]["tau"] for o in outs) < 0.95


def test_judged_agentic_queries_count_and_a_context_tau_is_not_observed(scene):
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    graph = build(agent("A"), gate, judge_rule="yes").compile()
    out = graph.invoke(query(scene, 0))
    assert out["route"] == "judged-agentic" and out["draft"] is None
    [obs] = entries(gate)
    assert obs.score is None and not obs.accepted

    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    graph = build(agent("A"), gate).compile()
    out = graph.invoke(query(scene, 0, 5.0), context={"tau": 0.9})
    assert out["route"] == "speculative" and "tau" not in out["draft"]
    assert entries(gate) == []


async def test_abatch_gates_online_too(scene):
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    graph = build(agent(lambda q: "A" if number(q) == 1 else "B"), gate).compile()
    outs = await graph.abatch([query(scene, i, 9.0 if i % 2 else 5.0) for i in range(10)])
    assert gate.shadows.drain(30)
    assert [o["route"] for o in outs] == ["rejected-agentic", "speculative"] * 5
    assert len(entries(gate)) == 10
    rejected = [o for o in entries(gate) if not o.accepted]
    assert all(o.disagrees is True for o in rejected)  # only q1 agrees, and it was accepted


class DiesAfterTheGate(InMemorySaver):
    """The worker dies once the gate node has run, before its writes are saved."""

    dying = True

    def put_writes(self, config, writes, task_id, task_path=""):
        if self.dying and any(channel == "answer" for channel, _ in writes):
            self.dying = False
            raise RuntimeError("the worker died")
        return super().put_writes(config, writes, task_id, task_path)


def test_a_reused_thread_and_a_redelivered_run_are_observed_once_each(scene):
    """On a checkpointer thread each run is its own query. A run whose worker died after the
    gate observed it, taken over with the same run id (as a server redelivers it), runs the
    gate again and replaces its entry instead of adding one."""
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(warmup=100), labels=LabelOptions(seed=0)
    )
    saver = DiesAfterTheGate()
    saver.dying = False
    graph = build(agent("A"), gate).compile(checkpointer=saver)
    thread = {"configurable": {"thread_id": "t"}}
    for i in range(3):
        graph.invoke(query(scene, i), thread)
    assert len(entries(gate)) == 3

    saver.dying = True
    run = {"configurable": {"thread_id": "u"}, "run_id": "r1", "metadata": {"run_id": "r1"}}
    with pytest.raises(RuntimeError, match="the worker died"):
        graph.invoke(query(scene, 0), run)
    assert len(entries(gate)) == 4  # the gate had observed it
    again = graph.invoke(query(scene, 0), run)
    assert again["route"] == "speculative" and again["answer"] == "A"
    assert len(entries(gate)) == 4


def test_workers_sharing_a_store_share_one_gate(scene, shared_store):
    """Two workers (two graphs, each with a gate of its own, as two processes have) over one
    store: what one labels moves the other's tau. Worker A sees confident drafts the agent
    contradicts; worker B, which has seen nothing itself, stops accepting them too."""
    risk, trust = RiskOptions(window=200, warmup=20), TrustOptions(sync_s=0.0, key=KEY)
    gates = [
        OnlineGate(0.05, 0.5, tau=0.98, risk=risk, labels=LabelOptions(seed=s), trust=trust)
        for s in (0, 1)
    ]
    graphs = [build(agent("B"), g).compile(store=shared_store) for g in gates]
    graphs[0].batch([query(scene, i, 9.0) for i in range(40)], {"max_concurrency": 4})
    assert gates[0].shadows.drain(30)
    assert gates[0].tau > 0.9955 and gates[1].seen == 0
    out = graphs[1].invoke(query(scene, 99, 9.0))
    assert out["route"] == "rejected-agentic" and out["draft"]["tau"] > 0.9955
    assert gates[1].ledger.shared and len(gates[1].ledger.recent()) == 41
    namespace = ("speceyes", "online_gate", "default")
    items = shared_store.search(namespace, limit=1000)
    entries = [i for i in items if tuple(i.namespace) == namespace]
    assert len(entries) == 41  # one per query, both workers' together
    assert {tuple(i.namespace) for i in items} == {namespace, (*namespace, "workers")}


def test_a_store_that_fails_loses_labels_not_answers(scene):
    class Down(InMemoryStore):
        def batch(self, ops):
            raise ConnectionError("the store is unreachable")

    gate = OnlineGate(
        0.05,
        0.5,
        tau=0.98,
        risk=RiskOptions(warmup=100),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(key=KEY),
    )
    graph = build(agent("B"), gate).compile(store=Down())
    outs = graph.batch([query(scene, i, 9.0 if i % 2 else 5.0) for i in range(4)])
    assert gate.shadows.drain(30)
    assert [o["error"] for o in outs] == [None] * 4
    assert [o["answer"] for o in outs] == ["B", "A", "B", "A"]
    assert gate.state()["tightened"] and "cannot" in gate.state()["trouble"]


def test_it_starts_from_a_gate_file(tmp_path):
    """A gate file (``speceyes calibrate``, labelled or ``--unlabelled``) gives the start tau
    and the score's settings; an explicit tau wins."""
    import json

    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"gate": {"tau": 0.9312, "k": 32, "aggregation": "mean"}}))
    gate = OnlineGate(0.02, 0.1, config=path)
    assert gate.tau == gate.start_tau == 0.9312
    assert (gate.config.k, gate.config.aggregation) == (32, "mean")
    assert OnlineGate(0.02, 0.1, config=path, tau=0.97).tau == 0.97


def test_the_report_shows_the_online_gate_path(scene, tmp_path):
    """A run gated online, reported against an agent-only run: the section with the path
    (tau met, the gate's estimate and bound, realised risk against the agent's answers), and
    its plot. The agent answers B to every question; drafts say A, so every accepted draft is
    a loss against the agent, though right against the reference."""
    import json

    from speceyes_graph.benchmarks.datasets import BenchQuery
    from speceyes_graph.benchmarks.report import write_report
    from speceyes_graph.benchmarks.runner import run_benchmark

    queries = [
        BenchQuery(f"q{i}", query(scene, i, 9.0)["question"], "A", "all", OPTIONS, image=scene)
        for i in range(40)
    ]
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(window=100, warmup=10), labels=LabelOptions(seed=0)
    )
    online = build(agent("B"), gate).compile()
    run_benchmark(online, queries, tmp_path / "online", mode="speceyes", concurrency=1,
                  progress=False, settings={"max_risk": 0.05})  # fmt: skip
    assert gate.shadows.drain(30)
    baseline = build(agent("B"), None, mode="agent").compile()
    run_benchmark(baseline, queries, tmp_path / "agent", mode="agent", progress=False)
    report = write_report(tmp_path / "online", tmp_path / "agent")
    path = report["online_gate"]
    assert path["queries"] == path["gated"] == 40 and path["against"] == "agent"
    records = [json.loads(line) for line in (tmp_path / "online" / "records.jsonl").open()]
    accepted = sum(r["route"] == "speculative" for r in records)
    assert path["accepted"] == accepted and 0 < accepted < 40
    assert path["realised_risk"] == accepted / 40  # every accepted draft disagrees
    assert path["tau_start"] == 0.98 and path["tau_end"] > 0.9955
    assert [s["tau"] for s in path["path"]] == [r["draft"]["tau"] for r in records]
    md = (tmp_path / "online" / "report.md").read_text()
    assert "## Online gate" in md and "disagrees with agent only's answer" in md
    assert (tmp_path / "online" / "online_gate.png").stat().st_size > 10_000


def test_a_store_ledger_keeps_the_last_window_and_prunes_what_no_window_holds(shared_store):
    """Two ledgers over one store (two workers): each reads the other's writes at its next
    sync, keeps the last ``window`` by the observations' own time whatever order the store
    returns them in, and deletes entries that fell out of the window, so the namespace stays
    about a window long; a late label replaces its query's entry."""
    import time

    from speceyes_graph.gate.keys import GateKeys
    from speceyes_graph.gate.ledger import Observation, StoreLedger

    keys = GateKeys(KEY)
    a, b = (StoreLedger(shared_store, ("t", "ledger"), 10, keys, sync_s=0.0) for _ in range(2))
    t0 = time.time() - 100
    for i in range(30):
        (a if i % 2 else b).record(f"k{i}", Observation(t0 + i, 0.99, True, True, None))
    assert a.sync() and b.sync()
    for ledger in (a, b):
        assert [o.at for o in ledger.recent()] == [t0 + i for i in range(20, 30)]
    left = shared_store.search(("t", "ledger"), limit=100)
    assert len([i for i in left if tuple(i.namespace) == ("t", "ledger")]) == 10  # pruned
    beats = [i.key for i in left if tuple(i.namespace) == ("t", "ledger", "workers")]
    assert sorted(beats) == sorted([a.worker, b.worker])  # each one's sign of life
    a.record("k30", Observation(t0 + 30, 0.99, True, True, None))
    a.record("k21", Observation(t0 + 21, 0.99, True, True, False))  # a label arriving late
    assert b.sync()
    assert [o.at for o in b.recent()] == [t0 + i for i in range(21, 31)]
    assert next(o for o in b.recent() if o.at == t0 + 21).disagrees is False
    assert a.trouble() is None and dict(a.skipped) == {}
