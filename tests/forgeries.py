"""What a client of a server can do to the online gate through the thread API (issue 66), as
``langgraph_sdk`` calls: shared by the ``langgraph dev`` tests (``tests/test_server.py``)
and the Aegra ones (``tests/test_aegra.py``).

Each forgery hands the graph's nodes state the client wrote, on a thread of its own that
holds one real query the gate rejected: the gate's output written by ``update_state``, a
draft written as ``speculate``'s, a ``Command`` into the agent loop, a fork of the real
run's checkpoint between the gate and the agent with its draft rewritten, and an interrupted
run resumed after its draft was rewritten. Before issue 66 each recorded a label, signed
with the deployment's key, for the key, score and time the client chose (or rewrote the real
query's). What the gate counts is seen the way any client sees it: a run's draft says what
the gate's tau rested on (``gate_counts``), so a *probe* (a query the gate rejects, on a
thread of its own, adding exactly its own labelled query) before and after a forgery shows
whether the forgery counted."""

from __future__ import annotations

import base64
import io
import time
import uuid
from collections.abc import Callable
from typing import Any

from PIL import Image

from speceyes_graph.answers import answers_agree

ONLINE = "speceyes_online"  # the assistant forged against (Aegra's tests name another)


def forged_draft(text: str, score: float) -> dict[str, Any]:
    return {"text": text, "score": score, "accepted": False, "tau": 0.98, "gated_at": time.time()}


def agrees(out: dict[str, Any], inputs: dict[str, Any]) -> bool:
    return answers_agree(out["draft"]["text"], out["answer"], inputs.get("options"))


def probe(
    client: Any, inputs: dict[str, Any], assistant: str = ONLINE
) -> tuple[dict[str, int], dict[str, int]]:
    """(what the gate's tau rested on when it decided this query, what this query adds)."""
    thread = client.threads.create()["thread_id"]
    out = client.runs.wait(thread, assistant, input=inputs)
    assert out["error"] is None and out["route"] == "rejected-agentic", out
    own = {"window": 1, "labelled": 1, "disagreeing": int(not agrees(out, inputs))}
    return out["draft"]["gate_counts"], own


def _go_on(client: Any, thread: str, assistant: str) -> dict:
    """A run from the thread's latest checkpoint, as a client continues one (named: Aegra
    wants a run to say what it starts from)."""
    head = client.threads.get_state(thread)["checkpoint"]
    return client.runs.wait(thread, assistant, input=None, checkpoint=head)


def _as_gate(client: Any, thread: str, inputs: dict, real: dict, assistant: str) -> dict:
    """The issue's forgery: a rejected route, a draft and a fresh key, as the gate wrote them."""
    forged = {"gate_key": f"a key of the client's, {uuid.uuid4()}", "route": "rejected-agentic"}
    forged["draft"] = forged_draft(real["answer"], 0.51)  # agrees with what the agent says
    client.threads.update_state(thread, forged, as_node="gate")
    return _go_on(client, thread, assistant)


def _as_gate_on_the_real_key(
    client: Any, thread: str, inputs: dict, real: dict, assistant: str
) -> dict:
    """The real query's own key and route, its draft rewritten to flip its label."""
    state = client.threads.get_state(thread)["values"]
    text = "zzz" if agrees(real, inputs) else real["answer"]
    forged = {"gate_key": state["gate_key"], "route": "rejected-agentic"}
    forged["draft"] = {**real["draft"], "text": text}
    client.threads.update_state(thread, forged, as_node="gate")
    return _go_on(client, thread, assistant)


def _as_speculate(client: Any, thread: str, inputs: dict, real: dict, assistant: str) -> dict:
    """A draft the run did not make, at the score the client chose; its text flips the label
    of the real query's key, which the gate takes it under."""
    text = "zzz" if agrees(real, inputs) else real["answer"]
    client.threads.update_state(thread, {"draft": forged_draft(text, 0.51)}, as_node="speculate")
    return _go_on(client, thread, assistant)


def _command(client: Any, thread: str, inputs: dict, real: dict, assistant: str) -> dict:
    update = {"gate_key": f"a key of the client's, {uuid.uuid4()}", "route": "rejected-agentic"}
    update["draft"] = forged_draft(real["answer"], 0.6)
    return client.runs.wait(thread, assistant, command={"goto": "agent_loop", "update": update})


def _fork(client: Any, thread: str, inputs: dict, real: dict, assistant: str) -> dict:
    """The real run's checkpoint between the gate and the agent, its draft rewritten so the
    agent's answer flips its label, and a run from there."""
    history = client.threads.get_history(thread, limit=50)
    [between] = [s for s in history if s["next"] == ["agent_loop"]]
    text = "zzz" if agrees(real, inputs) else real["answer"]
    client.threads.update_state(
        thread,
        {"draft": {**real["draft"], "text": text}},
        as_node="gate",
        checkpoint_id=between["checkpoint"]["checkpoint_id"],
    )
    return _go_on(client, thread, assistant)


def _resumed(client: Any, thread: str, inputs: dict, real: dict, assistant: str) -> dict:
    """A run asked to stop before the agent (a client may ask that of a server), its draft
    rewritten, and a run resuming it."""
    client.runs.wait(thread, assistant, input=inputs, interrupt_before=["agent_loop"])
    text = "zzz" if agrees(real, inputs) else real["answer"]
    client.threads.update_state(thread, {"draft": {**real["draft"], "text": text}}, as_node="gate")
    return _go_on(client, thread, assistant)


FORGERIES: dict[str, Callable[[Any, str, dict, dict, str], dict]] = {
    "update_state as the gate": _as_gate,
    "update_state on the real run's key": _as_gate_on_the_real_key,
    "update_state as speculate": _as_speculate,
    "Command(goto=agent_loop)": _command,
    "fork of an old checkpoint": _fork,
    "interrupted run resumed": _resumed,
}


def check_forgery(client: Any, inputs: dict[str, Any], kind: str, assistant: str = ONLINE) -> None:
    """One forgery on a thread of the client's own: it still answers, and the gate counts
    nothing more than the probe's own query (the gate starts at tau 1.0 and stays there)."""
    thread = client.threads.create()["thread_id"]
    real = client.runs.wait(thread, assistant, input=inputs)
    assert real["error"] is None and real["route"] == "rejected-agentic", real
    before, own = probe(client, inputs, assistant)
    out = FORGERIES[kind](client, thread, inputs, real, assistant)
    assert out.get("error") is None and out.get("answer"), out  # the agent answered
    after, _ = probe(client, inputs, assistant)
    assert after == {k: before[k] + own[k] for k in before}, (kind, before, after)


def image_url() -> str:
    """A small PNG as a data URL (what a client sends)."""
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def check_failing_shadows(client: Any, assistant: str = "failing_shadows") -> None:
    """``tests/served/gates.py``'s ``failing_shadows``: a gate that accepts confident
    drafts (its shadows label them); then the shadow runs fail (the agent raises on what
    they ask) while drafts keep coming: within a few accepted drafts the gate is tightened
    to tau 1.0 (before issue 66 it accepted every one, its tau unmoved). A shadow's label
    lands after its run has answered, so how many are accepted first varies with the server."""

    def ask(i: int, broken: bool) -> dict:
        thread = client.threads.create()["thread_id"]
        question = f"q{i} sep=9.0 colour?" + (" broken" if broken else "")
        inputs = {"question": question, "images": [image_url()]}
        return client.runs.wait(thread, assistant, input=inputs)

    working = [ask(i, False) for i in range(4)]
    assert [o["route"] for o in working] == ["speculative"] * 4, working[-1]
    after = [ask(4 + i, True) for i in range(30)]
    accepted = [o["route"] == "speculative" for o in after]
    assert sum(accepted) <= 22, sum(accepted)  # before: 30 of 30
    assert not any(accepted[-8:]) and after[-1]["draft"]["tau"] == 1.0, after[-1]["draft"]


def gated_input(client: Any, candidates: list[dict[str, Any]], assistant: str) -> dict[str, Any]:
    """The first query the judge sends to the draft (it meets the gate), tried on a thread
    of its own."""
    for inputs in candidates:
        out = client.runs.wait(client.threads.create()["thread_id"], assistant, input=inputs)
        if out["route"] == "rejected-agentic":
            return inputs
    raise AssertionError("no candidate query reaches the gate")
