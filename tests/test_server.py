"""The served graphs through a real ``langgraph dev`` server and the ``langgraph_sdk`` client.

Starts the server from ``langgraph-cli[inmem]`` on a free loopback port with no environment
set (so it serves the shipped demo checkpoints, strictly), drives it as a remote user would,
and stops it. Deselect with ``-m "not server"``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import operator_attacks
import pytest
from forgeries import FORGERIES, check_failing_shadows, check_forgery

from speceyes_graph.models.servers import free_port  # never hands a port out twice

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the color of the object?"


LOGS: dict[str, Path] = {}  # each server's log, by its URL


def dev_server(tmp_path_factory, *args, **settings):
    """``langgraph dev`` on a free loopback port (extra command-line ``args``) with only
    ``settings`` of the SPECEYES_* environment; yields its URL and stops it (and everything
    it started)."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECEYES_", "LANGSMITH_"))}
    env.update(
        SPECEYES_BLOB_DIR=str(tmp_path_factory.mktemp("blobs")),
        LANGSMITH_TRACING="false",
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        **settings,
    )
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    LOGS[f"http://127.0.0.1:{port}"] = Path(log.name)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "langgraph_cli", "dev", "--port", str(port),
            "--host", "127.0.0.1", "--no-browser", "--no-reload", *args,
        ],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/ok", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            proc.poll()
        if proc.returncode is not None or time.time() >= deadline:
            log.seek(0)
            pytest.fail(f"langgraph dev did not start:\n{log.read()[-3000:]}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert proc.returncode is not None  # the server we started is gone


# the online gate's key, new each session: entries an earlier session left in the server's
# store on disk (.langgraph_api) do not verify, so they do not count
GATE_KEY = os.urandom(24).hex()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """No environment set but the online gate's key, and the settings its tests set per run
    allowed (an operator's choice: by default a client sets only ``on_error``): the shipped
    demo checkpoints, in the server's process."""
    # the online graph starts where the served gate does (its routes are the plain graph's)
    yield from dev_server(
        tmp_path_factory, SPECEYES_GATE_KEY=GATE_KEY, SPECEYES_GATE_START_TAU="0.98",
        SPECEYES_CLIENT_SETTINGS="tau,mode,on_error",
    )  # fmt: skip


@pytest.fixture(scope="module")
def vllm_dev_server(tmp_path_factory, vllm_servers):
    """The served graphs configured through SPECEYES_*_URL, on real vLLM servers of the demo
    checkpoints (served as ``small`` and ``large``)."""
    yield from dev_server(
        tmp_path_factory,
        SPECEYES_SMALL_URL=vllm_servers["small"].url,
        SPECEYES_SMALL_MODEL="small",
        SPECEYES_LARGE_URL=vllm_servers["large"].url,
        SPECEYES_LARGE_MODEL="large",
    )


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Demo scenes and what the same graph answers in this process (the reference)."""
    return reference_scenes(tmp_path_factory.mktemp("scenes"))


def reference_scenes(folder: Path) -> list[tuple[dict, dict]]:
    """Six demo queries written to ``folder`` as (the plain graph's inputs, what the plain
    graph answers in this process)."""
    from speceyes_graph.demo import demo_graph, demo_models, demo_queries

    queries = demo_queries(folder, n=6, seed=7)
    models = demo_models(batch_size=1)  # the server runs one query at a time, too
    local = demo_graph(models["small"], models["large"]).compile()
    out = []
    for q in queries:
        data = "data:image/png;base64," + base64.b64encode(Path(q.image).read_bytes()).decode()
        inputs = {"question": q.question, "images": [data], "options": q.options}
        out.append((inputs, local.invoke(inputs)))
    return out


def test_runs_on_one_thread_through_the_server(server, scenes):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server)
    assert {a["graph_id"] for a in client.assistants.search()} == {
        "speceyes",
        "speceyes_chat",
        "speceyes_example",
        "speceyes_online",
        "speceyes_agent",
    }
    thread = client.threads.create()["thread_id"]
    inputs, expected = scenes[0]

    good = client.runs.wait(thread, "speceyes", input=inputs)
    assert good["error"] is None
    assert (good["route"], good["answer"]) == (expected["route"], expected["answer"])

    # a stranger's local path: refused, and the run fails (served graphs raise)
    bad = client.runs.create(
        thread, "speceyes", input={"question": QUESTION, "images": ["/etc/passwd"]}
    )
    client.runs.join(thread, bad["run_id"])
    bad_run = client.runs.get(thread, bad["run_id"])
    assert bad_run["status"] == "error"

    # the thread is not poisoned: the next run starts clean
    for inputs, expected in scenes[1:3]:
        again = client.runs.wait(thread, "speceyes", input=inputs)
        assert again["error"] is None
        assert (again["route"], again["answer"]) == (expected["route"], expected["answer"])
        if expected["route"] == "speculative":
            assert again["agent_steps"] == [] and again["stop_reason"] is None
    state = client.threads.get_state(thread)["values"]
    assert state["error"] is None and "base64" not in json.dumps(state)
    # nor anything a client reads of the thread's past (the runs' inputs were data: URLs)
    assert "data:image" not in json.dumps(client.threads.get_history(thread, limit=100))
    assert state["query"]["images"][0].startswith("blob://")

    # streaming: the route is decided node by node
    nodes = [
        next(iter(chunk.data))
        for chunk in client.runs.stream(
            thread, "speceyes", input=scenes[0][0], stream_mode="updates"
        )
        if chunk.event == "updates"
    ]
    assert nodes[0] == "intake" and nodes[1] in ("judge",)

    # per-run settings through the run's context: tau 1.0 rejects every draft
    speculative = next(i for i, e in scenes if e["route"] == "speculative")
    strict = client.runs.wait(thread, "speceyes", input=speculative, context={"tau": 1.0})
    assert strict["route"] == "rejected-agentic" and strict["draft"]["accepted"] is False


def test_no_client_can_steer_the_online_gate_through_the_store_api(server, scenes):
    """``speceyes_online`` under ``langgraph dev`` with the shipped auth rule: each run's
    draft records the tau it met; a client that writes 2,000 entries in the gate's own shape
    into its namespace, rewrites or deletes the entries of its own runs, writes malformed
    values, or reads the namespace, is refused every time (HTTP 403); and the runs after
    it gate exactly as before. (Before the rule, the same writes moved tau from 0.98 to 0.5.)
    The gate's entries are the server's to read: tests/test_aegra.py reads them in the
    database."""
    import time as _time

    from langgraph_sdk import get_sync_client
    from langgraph_sdk.errors import PermissionDeniedError

    client = get_sync_client(url=server)

    def online_runs() -> dict[str, dict]:
        outs = {}
        for inputs, expected in scenes:
            thread = client.threads.create()["thread_id"]
            out = client.runs.wait(thread, "speceyes_online", input=inputs)
            assert out["error"] is None and out["route"] == expected["route"]
            outs[client.runs.list(thread)[0]["run_id"]] = out
        return outs

    before = online_runs()
    for out in before.values():
        if out["route"] != "judged-agentic":
            assert out["draft"]["tau"] == 0.98 and isinstance(out["draft"]["shadowed"], bool)

    namespace = ["speceyes", "online_gate", "speceyes_online"]
    now = _time.time()
    shaped = {"at": now, "t": f"{now:020.6f}", "score": 0.999, "accepted": True,
              "shadowed": True, "disagrees": False}  # fmt: skip
    attempts = [
        lambda i=i: client.store.put_item(namespace, f"fake{i}", shaped) for i in range(2000)
    ]
    for run in before:
        attempts.append(lambda run=run: client.store.put_item(namespace, f"{run}|", shaped))
        attempts.append(lambda run=run: client.store.delete_item(namespace, f"{run}|"))
        attempts.append(lambda run=run: client.store.get_item(namespace, f"{run}|"))
    for bad in ({"at": "inf"}, {"t": "zzz"}, {"score": "nan", "accepted": "false"}):
        attempts.append(lambda bad=bad: client.store.put_item(namespace, "bad", {**shaped, **bad}))
    for prefix in (namespace, namespace[:2], namespace[:1], []):
        attempts.append(lambda prefix=prefix: client.store.search_items(prefix, limit=1000))
    refused = 0
    for attempt in attempts:
        try:
            attempt()
        except PermissionDeniedError:
            refused += 1
    assert refused == len(attempts)
    # a client's own namespaces still work
    client.store.put_item(["mine"], "k", {"v": 1})
    assert client.store.get_item(["mine"], "k")["value"] == {"v": 1}

    _time.sleep(1.5)  # past the workers' sync interval: the next decision reads the store
    after = online_runs()
    assert [(o["route"], o["answer"]) for o in after.values()] == [
        (o["route"], o["answer"]) for o in before.values()
    ]
    for out in after.values():
        if out["route"] != "judged-agentic":
            assert out["draft"]["tau"] == 0.98 and out["draft"]["gate_risk"] is None


def test_schemas_describe_the_inputs(server):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server)
    assistant = client.assistants.search(graph_id="speceyes")[0]
    schemas = client.assistants.get_schemas(assistant["assistant_id"])
    images = schemas["input_schema"]["properties"]["images"]
    assert "data:image/png;base64" in images["description"]
    assert {"tau", "k", "aggregation", "mode", "max_agent_steps"} <= set(
        schemas["context_schema"]["properties"]
    )


def test_chat_graph_through_the_server(server, scenes):
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server)
    thread = client.threads.create()["thread_id"]
    inputs, _ = scenes[0]
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": inputs["question"]},
            {"type": "image_url", "image_url": {"url": inputs["images"][0]}},
        ],
    }
    out = client.runs.wait(thread, "speceyes_chat", input={"messages": [message]})
    turn = [m["type"] for m in out["messages"]]  # the zooms, if any, then the answer
    assert turn[0] == "human" and turn[-1] == "ai" and set(turn[1:-1]) <= {"ai", "tool"}
    assert out["messages"][-1]["content"] and out["error"] is None
    assert out["route"] in ("speculative", "judged-agentic", "rejected-agentic")
    state = client.threads.get_state(thread)["values"]
    assert "base64" not in json.dumps(state)
    # nor any earlier checkpoint a client reads (the turn's first checkpoints held the pasted
    # image until LangGraph's record of the input kept it as a key)
    history = json.dumps(client.threads.get_history(thread, limit=100))
    assert "data:image" not in history and "iVBOR" not in history


def chat_message(inputs) -> dict:
    """A demo query as a chat user types it: the question, an Options: line, the image."""
    text = inputs["question"] + "\nOptions: " + "; ".join(inputs["options"])
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": inputs["images"][0]}},
        ],
    }


def test_the_chat_front_answers_every_demo_question_as_the_plain_graph(server, scenes):
    """The default Studio chat graph (the demo checkpoints, which learned multiple-choice
    prompts only): with an Options: line it answers as the plain graph does, zooms included."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server)
    assert {e["route"] for _, e in scenes} >= {"speculative", "judged-agentic"}
    for inputs, expected in scenes:
        thread = client.threads.create()["thread_id"]
        out = client.runs.wait(thread, "speceyes_chat", input={"messages": [chat_message(inputs)]})
        assert out["error"] is None
        assert (out["route"], out["messages"][-1]["content"]) == (
            expected["route"],
            expected["answer"],
        )


def test_the_chat_stream_with_subgraphs_carries_the_zooms_and_the_answer(server, scenes):
    """With subgraphs, as agent-chat-ui streams: the messages stream carries the agent's
    zoom (a tool call and its result) and the answer, in the chat's own namespace, and
    nothing of the inner run (the judge, raw agent turns); the inner run's state stays off
    the values stream (a chat UI would take it for the thread's), its updates do not."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server)
    inputs, expected = next((i, e) for i, e in scenes if e["route"] == "judged-agentic")
    thread = client.threads.create()["thread_id"]
    chunks = list(
        client.runs.stream(
            thread,
            "speceyes_chat",
            input={"messages": [chat_message(inputs)]},
            stream_mode=["messages-tuple", "updates", "values"],
            stream_subgraphs=True,
        )
    )
    messages = [c.data[0] for c in chunks if c.event.startswith("messages")]
    assert all(c.event == "messages" for c in chunks if c.event.startswith("messages"))
    assert [m["type"] for m in messages] == ["ai", "tool", "ai"]
    assert messages[0]["tool_calls"] and messages[-1]["content"] == expected["answer"]
    inner = [c for c in chunks if c.event.startswith("updates|")]  # namespaced: a subgraph's
    assert any("agent" in c.data for c in inner)
    assert all("messages" in c.data for c in chunks if c.event.startswith("values"))


def test_the_middleware_agent_through_the_server(server, scenes):
    """``speceyes_agent`` (``create_agent`` with SpecEyesMiddleware) under ``langgraph dev``:
    the demo questions as the turns of one thread, each judged alone, give the routes and
    replies the same agent gives in this process on the same conversation; an accepted
    turn streams only its reply; nothing a client reads of the thread holds pixels."""
    from langchain_core.messages import HumanMessage, convert_to_messages
    from langgraph_sdk import get_sync_client

    from speceyes_graph.demo import DEMO_PROMPTS, demo_models
    from speceyes_graph.gate.separability import GateConfig
    from speceyes_graph.integrations.studio import make_agent_graph
    from speceyes_tools.images import ImageStore

    def message(inputs) -> dict:
        text = DEMO_PROMPTS.question(inputs["question"], inputs["options"])
        image = {"type": "image_url", "image_url": {"url": inputs["images"][0]}}
        return {"role": "user", "content": [{"type": "text", "text": text}, image]}

    models = demo_models(batch_size=1)
    local = make_agent_graph(
        {"speculator": models["small"], "agent": models["large"], "prompts": DEMO_PROMPTS,
         "gate": GateConfig(), "tools": "deepeyes"},
        ImageStore(),
    )  # fmt: skip
    client = get_sync_client(url=server)
    thread = client.threads.create()["thread_id"]
    history: list = []
    routes = set()
    for inputs, _ in scenes:
        sent = message(inputs)
        mine = local.invoke(
            {"messages": [*history, HumanMessage(**convert_to_messages([sent])[0].model_dump())]}
        )
        history = mine["messages"]
        served = client.runs.wait(thread, "speceyes_agent", input={"messages": [sent]})
        assert served["speceyes"]["route"] == mine["speceyes"]["route"]
        assert served["messages"][-1]["content"] == mine["messages"][-1].content
        routes.add(mine["speceyes"]["route"])
        if mine["speceyes"]["route"] == "speculative":
            meta = served["messages"][-1]["response_metadata"]["speceyes"]
            assert meta["route"] == "speculative" and meta["score"] > meta["tau"]
    assert routes >= {"speculative", "judged-agentic"}
    state = client.threads.get_state(thread)["values"]
    assert len([m for m in state["messages"] if m["type"] == "human"]) == len(scenes)
    assert "base64" not in json.dumps(state)
    history_json = json.dumps(client.threads.get_history(thread, limit=200))
    assert "data:image" not in history_json and "iVBOR" not in history_json

    inputs = next(i for i, e in scenes if e["route"] == "speculative")
    chunks = list(
        client.runs.stream(
            client.threads.create()["thread_id"], "speceyes_agent",
            input={"messages": [message(inputs)]}, stream_mode="messages-tuple",
        )
    )  # fmt: skip
    streamed = [c.data[0] for c in chunks if c.event.startswith("messages")]
    # the accepted draft streams as the agent's replies do: its tokens, one message id
    assert streamed and {m["type"] for m in streamed} == {"AIMessageChunk"}
    assert len({m["id"] for m in streamed}) == 1 and "".join(m["content"] for m in streamed)


@pytest.mark.vllm
def test_the_served_graphs_run_on_vllm(vllm_dev_server, scenes):
    """langgraph dev with SPECEYES_*_URL: the same answers as the local graph, through vLLM
    (the servers report the demo checkpoints, so the graph speaks their prompts)."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=vllm_dev_server)
    thread = client.threads.create()["thread_id"]
    for inputs, expected in scenes:
        out = client.runs.wait(thread, "speceyes", input=inputs)
        assert out["error"] is None
        assert (out["route"], out["answer"]) == (expected["route"], expected["answer"])
    assert {e["route"] for _, e in scenes} >= {"speculative", "judged-agentic"}
    for inputs, expected in scenes:  # the chat front, options on an Options: line
        chat = client.runs.wait(client.threads.create()["thread_id"], "speceyes_chat",
                                input={"messages": [chat_message(inputs)]})  # fmt: skip
        assert chat["error"] is None
        assert (chat["route"], chat["messages"][-1]["content"]) == (
            expected["route"],
            expected["answer"],
        )


def concurrent_draft_batches(url, scenes, n_runs):
    """Batch sizes of the speculator's calls when ``n_runs`` runs are sent at once (mode
    ``small``: every run drafts at once, so the drafts can meet in one generate call)."""
    from langgraph_sdk import get_client

    async def send_all():
        client = get_client(url=url)

        async def one(i):
            thread = (await client.threads.create())["thread_id"]
            inputs = scenes[i % len(scenes)][0]
            run = await client.runs.create(
                thread, "speceyes", input=inputs, context={"mode": "small"}
            )
            return await client.runs.join(thread, run["run_id"])

        return await asyncio.gather(*(one(i) for i in range(n_runs)))

    outs = asyncio.run(send_all())
    assert all(o["error"] is None and o["route"] == "draft-only" for o in outs), outs[0]
    return [o["draft"]["batch_size"] for o in outs]


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory):
    """The demo checkpoints behind a server allowed 32 runs at once, in batches up to 32."""
    yield from dev_server(
        tmp_path_factory, "--n-jobs-per-worker", "32", SPECEYES_BATCH_SIZE="32",
        SPECEYES_CLIENT_SETTINGS="mode",  # the test drafts only: mode "small"
    )  # fmt: skip


def test_the_servers_job_limit_bounds_a_local_models_batches(wide_server, server, scenes):
    """How many runs meet in one generate call is bounded by the server: `langgraph dev`
    runs one job at a time unless given --n-jobs-per-worker (measured: batches of 1). With
    the limit raised, the async nodes let every run in flight wait on the batch worker at
    once, so batches fill past LangGraph Platform's default of 10 jobs (before the nodes
    were async: batches of at most 6, the server's thread pool on 2 CPUs).
    docs/deployment.md, "Scale out"."""
    default = concurrent_draft_batches(server, scenes, 24)
    wide = concurrent_draft_batches(wide_server, scenes, 32)
    assert max(default) == 1, default
    assert max(wide) > 10, wide


# --- issue 66: the thread API cannot forge the online gate's labels; threads have owners ---


@pytest.fixture(scope="module")
def owned_server(tmp_path_factory):
    """``speceyes_online`` and the example graph behind the shipped rules over identities
    (``tests/served/owner_auth.py``: an ``x-user`` header), the gate shared through the
    store with a key, starting at tau 1.0: every draft is rejected and labelled within its
    run, so what the gate counts is exact."""
    yield from dev_server(
        tmp_path_factory, "--config", "tests/served/langgraph.json",
        SPECEYES_GATE_KEY=GATE_KEY, SPECEYES_GATE_START_TAU="1.0",
    )  # fmt: skip


def client_of(url: str, user: str):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=url, headers={"x-user": user})


def gated(scenes) -> dict:
    """A query the judge sends to the draft (so it meets the gate)."""
    return next(inputs for inputs, expected in scenes if expected["route"] != "judged-agentic")


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_no_client_forges_a_gate_label_through_thread_state(owned_server, scenes, kind):
    """Each forgery of issue 66 through ``langgraph_sdk``, on the client's own thread: the
    forged run answers, and the gate counts nothing from it (before: one label per forged
    run, signed with the deployment's key, or the real query's label rewritten)."""
    check_forgery(client_of(owned_server, "mallory"), gated(scenes), kind)


def test_when_shadow_runs_fail_the_served_gate_tightens(owned_server):
    """The failing shadows of issue 66 through ``langgraph_sdk``: ``failing_shadows``
    accepts what its working shadows confirmed, then stops within a few accepted drafts
    once its shadow runs fail (before: all 30 accepted)."""
    check_failing_shadows(client_of(owned_server, "mallory"))


def test_threads_belong_to_whoever_made_them(owned_server):
    """Under the shipped rules with identities, one caller's threads, their state, history
    and runs are invisible and unwritable to another (404), searches list only the caller's
    own, and a thread made with another owner named in its metadata is the maker's."""
    import httpx
    from langgraph_sdk.errors import APIStatusError

    alice, bob = client_of(owned_server, "alice"), client_of(owned_server, "bob")
    thread = alice.threads.create(metadata={"owner": "bob"})["thread_id"]
    out = alice.runs.wait(
        thread, "speceyes_example", input={"question": "What colour?", "images": []}
    )
    assert out is not None
    assert alice.threads.get(thread)["metadata"]["owner"] == "alice"
    assert thread in {t["thread_id"] for t in alice.threads.search(limit=100)}
    assert thread not in {t["thread_id"] for t in bob.threads.search(limit=100)}
    refused = 0
    attempts = [
        lambda: bob.threads.get(thread),
        lambda: bob.threads.get_state(thread),
        lambda: bob.threads.get_history(thread),
        lambda: bob.threads.update_state(thread, {"route": "rejected-agentic"}, as_node="gate"),
        lambda: bob.runs.wait(thread, "speceyes_example", input=None),
        lambda: bob.threads.delete(thread),
    ]
    for attempt in attempts:
        try:
            attempt()
        except (APIStatusError, httpx.HTTPStatusError) as exc:  # runs.wait raises httpx's
            assert exc.response.status_code in (403, 404), exc
            refused += 1
    assert refused == len(attempts)
    assert alice.threads.get(thread)["thread_id"] == thread  # still there, still hers


def test_a_server_without_a_gate_key_says_so_when_the_graph_loads(wide_server, server, scenes):
    """``wide_server`` has no ``SPECEYES_GATE_KEY``: its log says so before any run, and
    each online answer's draft says its gate is this process's; ``server`` has one: shared."""
    from langgraph_sdk import get_sync_client

    assert "SPECEYES_GATE_KEY is not set" in LOGS[wide_server].read_text()
    assert "SPECEYES_GATE_KEY is not set" not in LOGS[server].read_text()
    inputs = gated(scenes)
    for url, scope in ((wide_server, "process"), (server, "shared")):
        client = get_sync_client(url=url)
        out = client.runs.wait(
            client.threads.create()["thread_id"], "speceyes_online", input=inputs
        )
        assert out["draft"]["gate_scope"] == scope


# --- issue 75: the shared gate is the operator's (tests/operator_attacks.py) ---

EXAMPLE = {"question": "What colour?", "images": []}  # the example graph's scripted models


def owned_gate(url: str) -> operator_attacks.Gate:
    """``fair_share`` on ``owned_server``: each probe a caller of its own, counts exact."""
    return operator_attacks.Gate(lambda user: client_of(url, user), identities=True)


def test_an_open_servers_assistants_are_the_operators(server):
    """The shipped ``langgraph.json`` (no identities): a client updating the example graph's
    default assistant to tau 0, deleting it or creating one is refused (403, naming
    SPECEYES_OPEN_ASSISTANT_WRITES); runs by graph id still work (before: the update
    went through, and every caller's runs met tau 0)."""
    from langgraph_sdk import get_sync_client

    operator_attacks.check_an_open_servers_assistants_are_the_operators(
        get_sync_client(url=server), "speceyes_example", EXAMPLE
    )


def test_assistants_belong_to_whoever_made_them(owned_server):
    """With identities: the default assistant is no caller's to change or delete, alice's
    own is invisible and unrunnable to bob, and an assistant's context meets the run
    allow-list (tests/operator_attacks.py)."""
    operator_attacks.check_assistants_belong_to_whoever_made_them(
        lambda user: client_of(owned_server, user), "speceyes_example", EXAMPLE
    )


def test_a_served_run_sets_only_what_the_operator_allows(owned_server):
    """``speceyes_example`` (``serve.py``) on a server that leaves the allow-list at its
    default (``server`` allows more, as its operator may): a run's context or configurable
    naming tau, mode, k, model_timeout_s or max_agent_steps fails with the SettingsError
    naming it (before: the run used it); on_error may be set."""
    operator_attacks.check_a_served_run_sets_only_on_error(
        client_of(owned_server, "mallory"), "speceyes_example", EXAMPLE
    )


def test_refused_settings_teach_the_gate_nothing(owned_server):
    """``fair_share``: the same settings refused, and the gate's counts unchanged by them
    (before: tau 0 accepted its draft, and a shadow labelled it)."""
    operator_attacks.check_refused_settings_teach_the_gate_nothing(
        client_of(owned_server, "mallory"), owned_gate(owned_server)
    )


def test_a_run_stopped_at_the_step_limit_labels_nothing(owned_server):
    """A rejected draft whose agent zooms until its step limit: the run ends, and no label
    is counted (before: one disagreeing label per such run, which a client could send at
    will to tighten everyone's gate)."""
    operator_attacks.check_a_run_stopped_at_the_step_limit_labels_nothing(
        client_of(owned_server, "mallory"), owned_gate(owned_server)
    )


def test_runs_interrupted_before_the_agent_do_not_dilute_the_window(owned_server):
    """Eight queries sent to the tools and interrupted before the agent, each by a caller of
    its own: the window does not grow (before: by eight, unlabelled entries that lowered
    the window's risk)."""
    operator_attacks.check_runs_interrupted_before_the_agent_do_not_dilute(
        lambda user: client_of(owned_server, user), owned_gate(owned_server)
    )


def test_one_caller_holds_at_most_its_share_of_the_window(owned_server):
    """Mallory's ten answered queries: the window gains four of them, fair_share's
    max_share of its 40 (before: all ten)."""
    operator_attacks.check_one_source_holds_at_most_its_share(
        client_of(owned_server, "mallory"), owned_gate(owned_server)
    )


def test_store_items_belong_to_whoever_wrote_them(owned_server):
    """With identities, bob neither reads, lists nor overwrites alice's store item of the
    same namespace and key (before: one namespace for all callers)."""
    operator_attacks.check_store_items_belong_to_whoever_wrote_them(
        client_of(owned_server, "alice"), client_of(owned_server, "bob")
    )


def test_a_run_stream_is_its_threads_owners(owned_server):
    """Bob joining the stream of alice's background run receives none of its events."""
    received = operator_attacks.check_a_run_stream_is_its_owners(
        client_of(owned_server, "alice"), client_of(owned_server, "bob"), "speceyes_example"
    )
    assert [c.event for c in received] == ["error"]  # langgraph dev: "404: Thread not found"
