"""What an outside client of a served graph could do to the operator's shared gate and
settings (issue 75), as ``langgraph_sdk`` calls: shared by the ``langgraph dev`` tests
(``tests/test_server.py``) and the Aegra ones (``tests/test_aegra.py``).

Before the issue a client steered the online gate every caller shares: a run's context (its
configurable, or an assistant's context) set tau, the mode, K, the step limit or the model
deadline, and the gate learnt from those runs; anyone could rewrite or delete a graph's
default assistant; a run stopped at the agent's step limit labelled its draft as
disagreeing; a query the judge sent to the tools counted in the window once judged, so runs
interrupted before the agent diluted it; one caller could fill the window; and one caller
read and overwrote another's store items.

The gate is ``fair_share`` (``tests/served/gates.py``): scripted models, a draft rejected at
tau 0.98 (``sep=5``) that the agent agrees with, a window of 40 holding at most 4 entries of
any one source. What it counts is seen as any client sees it (``tests/forgeries.py``): a
*probe*, a query on a thread of its own whose draft the gate rejects, reads
``draft.gate_counts`` (what the gate counted before the probe's own label). On a server with
identities each probe is a caller of its own, so between two probes the gate gains exactly
the first probe's entry plus what was done meanwhile. On an open server (every caller
``"anonymous"``) a source is a minute of traffic, so a probe's entry may take the place of an
older one of its minute: the checks there are bounds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from forgeries import image_url
from langgraph_sdk.errors import APIStatusError

GRAPH = "fair_share"
WINDOW, CAP = 40, 4  # fair_share's window, and max_share (0.1) of it: a source's most
BURST_S = 60.0  # an open server's source: a minute of traffic (TrustOptions.burst_s)
OWN = {"window": 1, "labelled": 1, "disagreeing": 0}  # a probe's own entry: an agreeing label
REFUSED = "SettingsError: this deployment does not let a run set"
# what an open server's refusal of assistant writes names (speceyes_graph.deploy.auth's
# ASSISTANT_WRITES_ENV; spelled here so that these checks run on the code before it too)
ASSISTANT_WRITES_ENV = "SPECEYES_OPEN_ASSISTANT_WRITES"

# settings a run names that a served graph's caller may not set (the default allow-list:
# on_error alone), each as a client sends it
FORBIDDEN: dict[str, tuple[str, dict[str, Any]]] = {
    "context tau": ("tau", {"context": {"tau": 0.0}}),
    "context mode": ("mode", {"context": {"mode": "small"}}),
    "context k": ("k", {"context": {"k": 2}}),
    "context model_timeout_s": ("model_timeout_s", {"context": {"model_timeout_s": 0.001}}),
    "context max_agent_steps": ("max_agent_steps", {"context": {"max_agent_steps": 1}}),
    "configurable tau": ("tau", {"config": {"configurable": {"tau": 0.0}}}),
}

Clients = Callable[[str], Any]  # the client of the named caller (open server: one for all)


def query(question: str) -> dict[str, Any]:
    return {"question": question, "images": [image_url()]}


Job = tuple[Any, str, dict[str, Any], dict[str, Any]]  # (client, assistant, input, run kwargs)


def run_all(jobs: list[Job], watch_s: float = 0.5) -> list[tuple[str, dict[str, Any]]]:
    """Runs, each on a thread of its own, all queued before any is waited for: (its status,
    its output). ``langgraph dev`` picks a queued run up about a second after it is created
    unless a client joins it, then the rest of its queue at once; Aegra's join of a running
    run answers about two seconds late, however short the run (a finished one's at once),
    so the runs are watched for ``watch_s`` first (Aegra's have ended by then), then joined."""
    started = []
    for client, assistant, inputs, kwargs in jobs:
        thread = client.threads.create()["thread_id"]
        run = client.runs.create(thread, assistant, input=inputs, **kwargs)["run_id"]
        started.append((client, thread, run))
    watch = time.monotonic() + watch_s
    ended = []
    for client, thread, run in started:
        while time.monotonic() < watch and not _ended(client, thread, run):
            time.sleep(0.05)
        out = client.runs.join(thread, run)
        ended.append((client.runs.get(thread, run)["status"], out))
    return ended


def _ended(client: Any, thread: str, run: str) -> bool:
    return client.runs.get(thread, run)["status"] not in ("pending", "running")


def error_of(out: dict[str, Any]) -> str:
    """A run's error: raised (the server's ``__error__``: a served graph raises unless the
    run sets ``on_error: "record"``) or recorded in its output."""
    raised = out.get("__error__")
    return str(raised.get("message") if isinstance(raised, dict) else out.get("error") or "")


def brief(out: dict[str, Any]) -> dict[str, Any]:
    """What a failed assertion shows of a run's output."""
    draft = out.get("draft") or {}
    keep = ("route", "answer", "stop_reason", "error")
    return {**{k: out.get(k) for k in keep}, "accepted": draft.get("accepted")}


def ask(client: Any, question: str, assistant: str = GRAPH, **kwargs: Any) -> dict[str, Any]:
    """A run on a thread of its own, waited for: its output."""
    [(_, out)] = run_all([(client, assistant, query(question), kwargs)])
    return out


def outcome(client: Any, assistant: str, inputs: dict, **kwargs: Any) -> tuple[str, str]:
    """A run on a thread of its own: (its status, its error)."""
    [(status, out)] = run_all([(client, assistant, inputs, kwargs)])
    return status, error_of(out)


def http_status(attempt: Callable[[], Any]) -> tuple[int | None, str]:
    """(the HTTP status an attempt was refused with, its detail); (None, "") if it went
    through."""
    try:
        attempt()
    except (APIStatusError, httpx.HTTPStatusError) as exc:  # runs.wait raises httpx's
        return exc.response.status_code, str(exc)
    return None, ""


class Gate:
    """``fair_share``'s gate as its clients see it. ``identities``: each probe is a caller
    of its own (exact counts); else a bound. ``settle_s``: wait this long before a probe, so
    that the worker deciding it has read the others' entries (Aegra: several instances)."""

    def __init__(self, clients: Clients, identities: bool, settle_s: float = 0.0):
        self.clients, self.identities, self.settle_s = clients, identities, settle_s

    def counts(self) -> dict[str, int]:
        time.sleep(self.settle_s)
        out = ask(self.clients(f"probe-{uuid.uuid4().hex[:8]}"), "probe sep=5")
        assert out["error"] is None and out["route"] == "rejected-agentic", brief(out)
        assert out["stop_reason"] == "answered" and out["draft"]["tau"] == 0.98, brief(out)
        counts = out["draft"]["gate_counts"]
        assert counts["window"] < WINDOW, counts  # room left: the counts can still grow
        return counts

    def added(self, before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
        """What the gate counted between two probes besides the first one's own entry."""
        return {k: after[k] - before[k] - OWN[k] for k in OWN}

    def check_nothing_added(
        self, before: dict[str, int], after: dict[str, int], keys: tuple[str, ...] = tuple(OWN)
    ) -> None:
        added = self.added(before, after)
        if self.identities:
            assert all(added[k] == 0 for k in keys), (keys, before, after)
        else:  # the first probe's entry may have taken an older one's place in its minute
            assert all(added[k] <= 0 for k in keys), (keys, before, after)


# --- (a) assistants are the operator's -------------------------------------------------------


def default_assistant(client: Any, graph: str) -> dict[str, Any]:
    return next(
        a
        for a in client.assistants.search(graph_id=graph, limit=100)
        if a["metadata"].get("created_by") == "system"
    )


def check_an_open_servers_assistants_are_the_operators(
    client: Any, graph: str, inputs: dict
) -> None:
    """A server without identities: a client's update (tau 0) or delete of the graph's
    default assistant, and any create, are refused with 403 saying what would allow them;
    the default is unchanged and runs by graph id still work (before: tau 0 for everyone)."""
    default = default_assistant(client, graph)
    attempts = {
        "update": lambda: client.assistants.update(default["assistant_id"], context={"tau": 0.0}),
        "delete": lambda: client.assistants.delete(default["assistant_id"]),
        "create": lambda: client.assistants.create(graph, context={"tau": 0.0}),
    }
    refused = {what: http_status(attempt) for what, attempt in attempts.items()}
    assert all(
        status == 403 and ASSISTANT_WRITES_ENV in detail for status, detail in refused.values()
    ), refused
    kept = client.assistants.get(default["assistant_id"])
    assert (kept["context"], kept["config"]) == (default["context"], default["config"])
    found = outcome(client, graph, inputs)
    assert found == ("success", ""), found


def check_assistants_belong_to_whoever_made_them(clients: Clients, graph: str, inputs: dict):
    """A server with identities: no caller changes or deletes the graph's default assistant
    (404: not theirs); alice's own assistant is invisible to bob, who can neither read,
    change, delete nor run it (404 or 403), while alice runs it; an assistant's context is
    held to the allow-list as a run's is."""
    alice, bob = clients("alice"), clients("bob")
    default = default_assistant(alice, graph)
    for what, attempt in {
        "update the default": lambda: alice.assistants.update(
            default["assistant_id"], context={"tau": 0.0}
        ),
        "delete the default": lambda: alice.assistants.delete(default["assistant_id"]),
    }.items():
        status, detail = http_status(attempt)
        assert status in (403, 404), (what, status, detail)

    mine = alice.assistants.create(graph, name="alice's")["assistant_id"]
    bobs_thread = bob.threads.create()["thread_id"]
    for what, attempt in {
        "get": lambda: bob.assistants.get(mine),
        "update": lambda: bob.assistants.update(mine, context={"tau": 0.0}),
        "delete": lambda: bob.assistants.delete(mine),
        "run": lambda: bob.runs.wait(bobs_thread, mine, input=inputs),
    }.items():
        status, detail = http_status(attempt)
        assert status in (403, 404), (what, status, detail)
    assert mine not in {a["assistant_id"] for a in bob.assistants.search(limit=100)}
    assert alice.assistants.get(mine)["context"] == {}  # still hers, unchanged

    steering = alice.assistants.create(graph, context={"tau": 0.0})["assistant_id"]
    by_graph, by_mine, by_steering = run_all(
        [(bob, graph, inputs, {}), (alice, mine, inputs, {}), (alice, steering, inputs, {})]
    )
    assert by_graph[0] == "success" and not error_of(by_graph[1]), by_graph  # as before
    assert by_mine[0] == "success" and not error_of(by_mine[1]), by_mine
    assert by_steering[0] == "error" and f"{REFUSED} tau" in error_of(by_steering[1]), by_steering


# --- (b) a run sets only what the operator allows -----------------------------------------------


def _check_refused(
    client: Any, assistant: str, inputs: dict, status: str, allowed: dict | None = None
) -> None:
    """Each of FORBIDDEN ends ``status`` with the SettingsError naming it; a run setting
    ``allowed`` (a context) answers."""
    jobs = [(client, assistant, inputs, kwargs) for _, kwargs in FORBIDDEN.values()]
    if allowed is not None:
        jobs.append((client, assistant, inputs, {"context": allowed}))
    found = run_all(jobs)
    for (name, (setting, _)), (ended, out) in zip(FORBIDDEN.items(), found):
        refused = f"{REFUSED} {setting} (a run may set: on_error)" in error_of(out)
        assert ended == status and refused, (name, ended, error_of(out) or brief(out))
    if allowed is not None:
        ended, out = found[-1]
        assert ended == "success" and not error_of(out), (allowed, ended, error_of(out))


def check_a_served_run_sets_only_on_error(client: Any, assistant: str, inputs: dict) -> None:
    """A served graph (it raises): a run naming tau, the mode, K, the model deadline or the
    step limit, in its context or its configurable, fails (status "error") with the
    SettingsError that says what it may set; ``on_error`` it may set (before: each ran
    under the client's setting)."""
    _check_refused(client, assistant, inputs, "error", allowed={"on_error": "record"})


def check_refused_settings_teach_the_gate_nothing(client: Any, gate: Gate) -> None:
    """``fair_share`` (it records errors): each refused run's output says why, and the gate
    counts nothing from it (before: tau 0 accepted the draft and its shadow labelled it)."""
    before = gate.counts()
    _check_refused(client, GRAPH, query("steer sep=5"), "success")
    gate.check_nothing_added(before, gate.counts())


# --- (c) a label is the agent's verdict -------------------------------------------------------


def check_a_run_stopped_at_the_step_limit_labels_nothing(client: Any, gate: Gate) -> None:
    """A rejected draft whose agent zooms until its step limit (2): the run ends, and the
    gate gains no label (before: one disagreeing label, the draft's own fallback as the
    agent's answer)."""
    before = gate.counts()
    out = ask(client, "zoom-forever sep=5")
    assert out["route"] == "rejected-agentic" and "step_limit" in (out["stop_reason"] or ""), brief(
        out
    )
    gate.check_nothing_added(before, gate.counts(), ("labelled", "disagreeing"))


# --- (d) a query sent to the tools counts once its agent answered ------------------------------


def check_runs_interrupted_before_the_agent_do_not_dilute(
    clients: Clients, gate: Gate, n: int = 8
) -> None:
    """``n`` queries the judge sends to the tools, each stopped before the agent
    (``interrupt_before``, which any client may ask), each by a caller of its own where
    there are identities: the window does not grow (before: by ``n``, entries with no
    draft that lowered the window's risk)."""
    before = gate.counts()
    stop = {"interrupt_before": ["agent_loop"]}
    jobs = [
        (clients(f"interrupter-{i}"), GRAPH, query(f"q{i} needs-tools"), stop) for i in range(n)
    ]
    for _, out in run_all(jobs):
        assert out["route"] == "judged-agentic" and out["answer"] is None, brief(out)
    gate.check_nothing_added(before, gate.counts(), ("window",))


# --- (e) each source holds at most its share of the window ------------------------------------


def check_one_source_holds_at_most_its_share(client: Any, gate: Gate, n: int = 10) -> None:
    """One caller's ``n`` answered queries sent to the tools: with identities the window
    gains exactly ``CAP`` of them (her own oldest make room for her newest); on an open
    server at most ``CAP`` per minute the test spans, the probe's own included (before: all
    ``n``)."""
    start = time.time()
    before = gate.counts()
    for _, out in run_all([(client, GRAPH, query(f"q{i} needs-tools"), {}) for i in range(n)]):
        assert out["route"] == "judged-agentic" and out["stop_reason"] == "answered", brief(out)
    after = gate.counts()
    if gate.identities:
        assert gate.added(before, after)["window"] == CAP, (before, after)
    else:
        minutes = int(time.time() // BURST_S) - int(start // BURST_S) + 1
        assert after["window"] - before["window"] <= CAP * minutes, (minutes, before, after)


# --- (f) store items are their caller's ----------------------------------------------------------


def check_store_items_belong_to_whoever_wrote_them(alice: Any, bob: Any) -> None:
    """Alice's item in ``["notes"]``: bob's get and search of the same namespace do not
    return it, and his put of the same key leaves hers as she wrote it (before: one
    namespace for all callers)."""
    hers = {"v": 1, "secret": uuid.uuid4().hex}  # the server's store outlives the session
    alice.store.put_item(["notes"], "k", hers)
    got = bob.store.get_item(["notes"], "k")
    assert got is None or got["value"] != hers, got
    found = bob.store.search_items(["notes"], limit=100)["items"]
    assert hers not in [item["value"] for item in found], found
    bob.store.put_item(["notes"], "k", {"v": 2})
    assert alice.store.get_item(["notes"], "k")["value"] == hers
    assert bob.store.get_item(["notes"], "k")["value"] == {"v": 2}
    # nor does he learn who else stores something (before the fix: ["alice", "notes"])
    listed = bob.store.list_namespaces()["namespaces"]
    assert not any("alice" in namespace for namespace in listed), listed


# --- (g) a run's stream is its thread's owner's --------------------------------------------------


def check_a_run_stream_is_its_owners(alice: Any, bob: Any, graph: str) -> list[Any]:
    """Bob joins the stream of alice's background run on her thread (he knows both ids):
    no event carries her run's data (langgraph dev answers 200 with a single ``error``
    event, "404: Thread not found"). Returns what bob received."""
    secret = f"alice's question {uuid.uuid4().hex}"
    thread = alice.threads.create()["thread_id"]
    run = alice.runs.create(thread, graph, input={"question": secret, "images": []})
    received: list[Any] = []
    try:
        for chunk in bob.runs.join_stream(
            thread, run["run_id"], stream_mode=["values", "updates", "messages-tuple"]
        ):
            received.append(chunk)
    except (APIStatusError, httpx.HTTPStatusError) as exc:
        assert exc.response.status_code in (403, 404), exc
    leaked = [
        (c.event, c.data)
        for c in received
        if c.event.split("|")[0] not in ("error", "metadata") or secret in json.dumps(c.data)
    ]
    assert not leaked, leaked
    alice.runs.join(thread, run["run_id"])
    assert secret in json.dumps(alice.threads.get_state(thread)["values"])  # hers to read
    return received
