"""The online gate trusts only what it wrote, and fails safe (issue 54).

In process, over LangGraph stores (in memory, and PostgreSQL, whose JSONB rewrites what it
keeps): entries nobody signed with the deployment's key, malformed ones and ones dated in
the future change no decision and never stop a read; a worker's window follows deletions
and overwrites as a fresh worker's would; a store that cannot be read or written tightens
the gate to its start tau instead of keeping a permissive one; an agent that fails gives no
agreement. The server side (the auth rule that keeps clients out of the gate's namespace)
is tested through ``langgraph dev`` in ``tests/test_server.py`` and on Aegra in
``tests/test_aegra.py``.

The key reaches the gates through ``SPECEYES_GATE_KEY``, as on a server."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from langgraph.store.memory import InMemoryStore
from test_online_graph import agent, build, query

from speceyes_graph.gate.keys import GateKeys, MissingGateKey
from speceyes_graph.gate.ledger import Observation, StoreLedger, entry_fields, read_entry
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions

KEY = "the deployment gate key of 32+ characters"
NAMESPACE = ("speceyes", "online_gate", "default")
PROBES = np.round(np.linspace(0.5, 1.0, 51), 3)


@pytest.fixture(autouse=True)
def gate_key(monkeypatch):
    monkeypatch.setenv("SPECEYES_GATE_KEY", KEY)


def worker(store, sync_s: float = 0.0, max_age_s: float | None = 7 * 86400.0) -> OnlineGate:
    return OnlineGate(
        0.05, 0.5, tau=0.98,
        risk=RiskOptions(window=400, warmup=50, max_age_s=max_age_s),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(store=store, sync_s=sync_s),
    )  # fmt: skip


def teach(gate: OnlineGate, n: int = 300, seed: int = 0, wrong_above: float = 0.9) -> None:
    """Real traffic: drafts rejected at tau 0.98 scoring 0.5-0.98, the agent contradicting
    half of those above ``wrong_above``; the agent's verdict labels each."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        score = float(rng.uniform(0.5, 0.98))
        decision = gate.decide(score)
        wrong = score > wrong_above and bool(rng.random() < 0.5)
        gate.observe(decision, score, wrong, key=f"real{i}")  # unshadowed: the gate drops it


def decisions(gate: OnlineGate) -> list[bool]:
    gate.refresh()
    return [gate.decide(float(s)).accepted for s in PROBES]


def fabricated(now: float) -> list[dict]:
    """What an outsider writes: entries in the gate's own shape (the old unsigned one, and
    the signed one with another key or a made-up signature), agreeing, confident, now."""
    keys = GateKeys("somebody else's key, not the deployment's")
    out = []
    for i in range(2000):
        obs = Observation(now - i * 0.01, 0.999, True, True, False)
        fields = entry_fields(obs)
        if i % 3 == 0:
            value = {**fields, "mac": keys.sign(NAMESPACE, f"fake{i}", fields)}
        elif i % 3 == 1:
            value = {**fields, "mac": f"{GateKeys(KEY).sign(NAMESPACE, 'x', fields)[:9]}{'0' * 64}"}
        else:  # the pre-signature shape
            value = {k: v for k, v in fields.items() if k not in ("v", "failed")}
            value["t"] = f"{obs.at:020.6f}"
        out.append(value)
    return out


def malformed(now: float) -> list[object]:
    good = entry_fields(Observation(now, 0.9, False, False, False))
    bad: list[object] = [
        {k: v for k, v in good.items() if k != "at"},
        {**good, "at": "zzz"},
        {**good, "at": "inf"},
        {**good, "at": math.inf},
        {**good, "score": "nan"},
        {**good, "score": math.nan},
        {**good, "score": 7.0},
        {**good, "score": True},
        {**good, "accepted": "false"},
        {**good, "disagrees": "false"},
        {**good, "disagrees": 0},
        {**good, "shadowed": True},  # shadowed but not accepted
        {**good, "v": "1"},
        {**good, "failed": None},
        [1, 2, 3],
        "a string",
    ]
    return bad


def test_fabricated_and_malformed_entries_change_no_decision(shared_store):
    """2,000 entries in the gate's own shape that its key did not sign, 16 malformed ones
    and signed ones dated ten years ahead, written straight into the store (past any API
    rule): every worker decides as before, a fresh one too; each is skipped and counted,
    and no read raises."""
    store = shared_store
    gate = worker(store)
    teach(gate)
    before = decisions(gate)
    assert gate.tau > 0.9 and 0 < sum(before) < len(before)

    now = time.time()
    kept = {"unverified": 0, "malformed": 0, "future": 0}
    keys = GateKeys(KEY)
    ahead = entry_fields(Observation(now + 3.2e8, 0.999, True, True, False))  # a fast clock
    attempts = [(f"fake{i}", v) for i, v in enumerate(fabricated(now))]
    attempts += [
        (f"bad{i}", v if isinstance(v, dict) else {"x": v}) for i, v in enumerate(malformed(now))
    ]
    attempts += [
        (f"ahead{i}", {**ahead, "mac": keys.sign(NAMESPACE, f"ahead{i}", ahead)}) for i in range(20)
    ]
    attempts += [
        ("absurd", {**entry_fields(Observation(now, 0.9, False, False, False)), "at": 1e300})
    ]
    for key, value in attempts:
        try:
            store.put(NAMESPACE, key, value, index=False)
        except Exception:  # PostgreSQL's JSON keeps no NaN or infinity: never stored
            continue
        expected = read_entry(value, NAMESPACE, key, keys, now)
        assert isinstance(expected, str), (key, value)
        kept[expected] += 1
    assert kept["unverified"] == 1334 and kept["future"] == 21 and kept["malformed"] >= 666 + 12

    assert decisions(gate) == before
    assert decisions(worker(store)) == before  # a fresh worker too
    skipped = gate.state()["skipped"]
    assert skipped == kept, skipped
    assert gate.state()["trouble"] is None and len(gate.ledger.recent()) == 300


def test_a_worker_follows_deletions_and_overwrites_as_a_fresh_worker_would(shared_store):
    """Entries deleted or overwritten in the store: a running worker's window becomes what
    a fresh worker builds from the store (it used to keep its own, only ever adding)."""
    store = shared_store
    gate = worker(store)
    teach(gate)
    for i in range(0, 300, 3):
        store.delete(NAMESPACE, f"real{i}")
    for i in range(1, 300, 9):
        store.put(NAMESPACE, f"real{i}", {"at": time.time(), "score": 0.1})
    gate.refresh()
    fresh = worker(store)
    fresh.refresh()
    assert sorted(o.at for o in gate.ledger.recent()) == sorted(o.at for o in fresh.ledger.recent())
    assert len(gate.ledger.recent()) == 300 - 100 - 34 and gate.tau == fresh.tau


class Switchable(InMemoryStore):
    """A store that can go down (every operation raises) and come back."""

    down = False

    def batch(self, ops):
        if self.down:
            raise ConnectionError("the store is unreachable")
        return super().batch(ops)


def test_a_store_outage_tightens_the_gate_instead_of_keeping_a_permissive_tau():
    """Tau has fallen (legitimately: the agent confirmed every draft) to 0.5; the store
    goes down and the traffic turns wrong (drafts at 0.7 the agent contradicts). The gate
    rejects them at its start tau, says why in its state, and comes back when the store
    does. Before: 60 of 60 accepted."""
    store = Switchable()
    gate = worker(store, max_age_s=None)
    teach(gate, wrong_above=1.0)
    assert gate.tau <= 0.55

    store.down = True
    accepted = 0
    for _ in range(60):
        gate.refresh()  # as each query does before its decision (sync_s=0)
        accepted += gate.decide(0.7).accepted
    assert accepted == 0
    state = gate.state()
    assert state["tightened"] and "cannot read the store" in state["trouble"]
    assert gate.tau == gate.start_tau == 0.98

    with pytest.raises(ConnectionError):  # a failed write tightens too (the caller logs it)
        gate.observe(gate.decide(0.99), 0.99, None, key="during")
    assert "cannot write" in gate.state()["trouble"]

    store.down = False
    gate.observe(gate.decide(0.99), 0.99, None, key="after")
    gate.refresh()
    assert gate.state()["trouble"] is None and gate.tau <= 0.55


def test_evidence_not_read_for_too_long_is_not_vouched_for():
    store = InMemoryStore()
    gate = worker(store, sync_s=3600.0, max_age_s=None)
    gate.ledger.stale_s = 0.2  # type: ignore[attr-defined]
    teach(gate, wrong_above=1.0)
    gate.refresh()
    assert gate.tau <= 0.55
    time.sleep(0.3)  # no read since: the next refit tightens
    gate.observe(None, None, None, key="judged")
    assert gate.tau == 0.98 and "last read the store" in gate.state()["trouble"]


def test_old_evidence_does_not_count():
    gate = OnlineGate(
        0.05,
        0.5,
        tau=0.98,
        risk=RiskOptions(window=400, warmup=50, max_age_s=3600),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(store=None),
    )
    old = time.time() - 7200
    for i in range(300):
        gate.ledger.record(f"o{i}", Observation(old + i, 0.6, False, False, False))
    gate.observe(None, None, None)
    assert gate.tau == gate.start_tau and gate.risk is None  # an empty window: warm-up


def test_an_agent_that_fails_gives_no_agreement(scene):
    """60 queries with the agent down (their drafts at 0.95 rejected at 0.98), then it comes
    back and contradicts drafts at 0.95. Before, the failures counted as agreements and
    moved tau below 0.95: the wrong drafts were accepted. Now they count against their
    drafts: none is."""
    gate = OnlineGate(
        0.05, 0.5, tau=0.98, risk=RiskOptions(window=200, warmup=20), labels=LabelOptions(seed=0)
    )
    down = build(agent(fail=True), gate).compile()
    for i in range(60):
        down.invoke(query(scene, i, 5.0))
    assert gate.state()["agent_failures"] == 60 and gate.tau >= 0.95
    back = build(agent("B"), gate).compile()
    outs = [back.invoke(query(scene, 100 + i, 5.0)) for i in range(10)]
    assert all(o["route"] == "rejected-agentic" for o in outs)


def test_a_shared_store_needs_a_key(scene, monkeypatch):
    """No key: a gate given a store refuses to be built; a gate told to share the run's
    store keeps to this process instead (logged, in its state), and writes nothing there."""
    monkeypatch.delenv("SPECEYES_GATE_KEY")
    with pytest.raises(MissingGateKey, match="SPECEYES_GATE_KEY"):
        OnlineGate(trust=TrustOptions(store=InMemoryStore()))
    gate = OnlineGate(0.05, 0.5, tau=0.98, labels=LabelOptions(seed=0))
    run_store = InMemoryStore()
    build(agent("A"), gate).compile(store=run_store).invoke(query(scene, 0))
    state = gate.state()
    assert not state["shared"] and "SPECEYES_GATE_KEY" in state["refused"]
    assert state["window"] == 1 and run_store.search(NAMESPACE) == []
    with pytest.raises(ValueError, match="at least 16"):
        GateKeys("short")


def test_keys_rotate():
    """Entries signed with the old key still count while it is listed after the new one."""
    store = InMemoryStore()
    old = StoreLedger(store, NAMESPACE, 10, GateKeys("the old key of this deployment"))
    old.record("a", Observation(time.time(), 0.9, False, False, True))
    both = StoreLedger(
        store, NAMESPACE, 10, GateKeys(["the new key of it", "the old key of this deployment"])
    )
    both.record("b", Observation(time.time(), 0.9, False, False, False))
    both.sync()
    assert len(both.recent()) == 2
    new = StoreLedger(store, NAMESPACE, 10, GateKeys("the new key of it"))
    new.sync()
    assert len(new.recent()) == 1 and dict(new.skipped) == {"unverified": 1}


def test_read_entry_checks_every_field():
    keys = GateKeys(KEY)
    now = time.time()
    for value in malformed(now):
        assert read_entry(value, NAMESPACE, "k", keys, now) == "malformed", value
    fields = entry_fields(Observation(now, 0.9, True, True, False))
    signed = {**fields, "mac": keys.sign(NAMESPACE, "k", fields)}
    assert read_entry(signed, NAMESPACE, "k", keys, now) == Observation(now, 0.9, True, True, False)
    assert read_entry(signed, NAMESPACE, "other key", keys, now) == "unverified"
    assert read_entry({**signed, "disagrees": True}, NAMESPACE, "k", keys, now) == "unverified"
    failed = entry_fields(Observation(now, 0.9, True, False, True, failed=True))
    assert (
        read_entry({**failed, "mac": keys.sign(NAMESPACE, "k", failed)}, NAMESPACE, "k", keys)
        == "malformed"
    )


@pytest.mark.parametrize(
    ("namespace", "refused"),
    [
        ([], True),
        (["speceyes"], True),
        (["speceyes", "online_gate"], True),
        (["speceyes", "online_gate", "speceyes_online"], True),
        ("speceyes.online_gate.speceyes_online", True),
        (["speceyes", "other"], False),
        (["mine", "speceyes", "online_gate"], False),
    ],
)
def test_the_auth_rule_keeps_clients_out_of_the_gates_namespace(namespace, refused):
    from langgraph_sdk import Auth

    from speceyes_graph.deploy.auth import refuse_gate_state

    for field in ("namespace", "namespace_prefix"):
        if refused:
            with pytest.raises(Auth.exceptions.HTTPException) as err:
                refuse_gate_state({field: namespace, "key": "k"})
            assert err.value.status_code == 403
        else:
            refuse_gate_state({field: namespace, "key": "k"})
    refuse_gate_state({"namespace": None, "suffix": None})  # list_namespaces: names only


async def test_the_open_auth_never_opens_a_server_set_up_for_langsmith(monkeypatch):
    from langgraph_sdk import Auth

    from speceyes_graph.deploy.auth import auth

    handler = auth._authenticate_handler
    assert handler is not None
    assert (await handler(headers={}))["identity"] == "anonymous"
    monkeypatch.setenv("LANGGRAPH_AUTH_TYPE", "langsmith")
    with pytest.raises(Auth.exceptions.HTTPException) as err:
        await handler(headers={})
    assert err.value.status_code == 401
