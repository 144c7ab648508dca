"""The served graphs on two Aegra instances over PostgreSQL and Redis, one of them killed.

``tests/aegra_cluster.py`` starts Redis, Aegra's schema and two instances as separate
processes, serving the package's graphs on the shipped demo checkpoints. Through
``langgraph_sdk``, as a user's client: runs over many threads (half on the plain graph, half
chats), each thread's runs in order
(Aegra does not order a thread's runs itself: the client waits for one before the next), and
every run must end ``success`` with the answer ``graph.invoke`` gives on the same models, and
every chat thread must hold its turns once, in order.
Then the same with one instance killed (SIGKILL) while it holds runs: Aegra's reaper
re-queues them once their leases lapse, another instance takes them over with the same run
id, and they must still end right (the graph's retry-safe input: ``tests/test_retry.py``).
"""

from __future__ import annotations

import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.aegra

THREADS, RUNS_PER_THREAD = 50, 4  # 200 runs


@pytest.fixture(scope="module")
def cluster(postgres, tmp_path_factory):
    from aegra_cluster import AEGRA, AegraCluster

    assert AEGRA.exists(), "Aegra is not set up: run `bash scripts/setup-aegra.sh`"
    dsn = postgres.create_database("aegra")
    c = AegraCluster(tmp_path_factory.mktemp("aegra"), dsn).start(2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def queries_and_answers(demo_local, tmp_path_factory):
    """Demo queries as data: URLs, and what graph.invoke answers on the same models."""
    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_queries

    folder = tmp_path_factory.mktemp("aegra-queries")
    queries = [
        {
            "question": q.question,
            "images": [
                "data:image/png;base64," + base64.b64encode(open(q.image, "rb").read()).decode()
            ],
            "options": q.options,
        }
        for q in demo_queries(folder, 24, micro_share=0.0)
    ]
    graph = create_speceyes_graph(
        speculator=demo_local["small"], agent=demo_local["large"], **DEMO_GRAPH_SETTINGS
    ).compile()
    outs = graph.batch(queries, {"max_concurrency": 24})
    return queries, [o["answer"] for o in outs]


def chat_message(query: dict) -> dict:
    """A query as a chat user types it: the question, an Options: line, the image."""
    text = query["question"] + "\nOptions: " + "; ".join(query["options"])
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": query["images"][0]}},
        ],
    }


def drive(url: str, queries, answers, on_progress=None) -> list[dict]:
    """THREADS threads (even ones on the plain graph, odd ones chats), RUNS_PER_THREAD runs
    each, in order; one result per run. A chat thread must hold each turn once, in order."""
    from langgraph_sdk import get_sync_client

    from speceyes_graph.compose import _spelled_out

    client = get_sync_client(url=url)
    results: list[dict] = []
    lock = threading.Lock()

    def conversation(t: int) -> None:
        chat = t % 2 == 1
        thread = client.threads.create()
        for r in range(RUNS_PER_THREAD):
            i = (t * RUNS_PER_THREAD + r) % len(queries)
            if chat:
                graph, payload = "speceyes_chat", {"messages": [chat_message(queries[i])]}
                expected = _spelled_out(answers[i], queries[i]["options"])
            else:
                graph, payload, expected = "speceyes", queries[i], answers[i]
            run = client.runs.create(thread["thread_id"], graph, input=payload)
            client.runs.join(thread["thread_id"], run["run_id"])
            final = client.runs.get(thread["thread_id"], run["run_id"])
            values = client.threads.get_state(thread["thread_id"])["values"]
            if chat:
                messages = values.get("messages") or []
                kinds = [m["type"] for m in messages]
                in_order = kinds == ["human", "ai"] * (r + 1)
                answer = messages[-1]["content"] if messages else None
            else:
                in_order, answer = True, values.get("answer")
            with lock:
                results.append(
                    {
                        "thread": thread["thread_id"],
                        "run": run["run_id"],
                        "status": final["status"],
                        "answer": answer,
                        "expected": expected,
                        "turns_in_order": in_order,
                    }
                )
                if on_progress:
                    on_progress(len(results))

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(conversation, range(THREADS)))
    return results


def check(results: list[dict]) -> None:
    assert len(results) == THREADS * RUNS_PER_THREAD
    bad = [r for r in results if r["status"] != "success"]
    assert not bad, bad[:3]
    assert [r["answer"] for r in results] == [r["expected"] for r in results]
    assert all(r["turns_in_order"] for r in results)


def test_runs_over_two_instances_answer_as_graph_invoke(cluster, queries_and_answers):
    queries, answers = queries_and_answers
    t0 = time.time()
    results = drive(cluster.url(0), queries, answers)
    print(f"aegra: {len(results)} runs over {THREADS} threads in {time.time() - t0:.0f} s")
    check(results)


def test_runs_held_by_a_killed_instance_are_finished_by_the_other(cluster, queries_and_answers):
    from langgraph_sdk import get_sync_client

    queries, answers = queries_and_answers
    killed: dict = {}

    def kill_once(done: int) -> None:
        if done < 40 or killed:
            return
        held = cluster.held_runs(1)
        if held:  # kill it while it holds runs
            killed.update(at=time.time(), done=done, held=held)
            cluster.kill(1)

    results = drive(cluster.url(0), queries, answers, on_progress=kill_once)
    assert killed, "instance 1 never held a run when checked"
    ended = time.time()
    held = set(killed["held"])
    print(
        f"aegra: instance 1 killed after {killed['done']} of {len(results)} runs, holding "
        f"{len(held)}; all runs ended {ended - killed['at']:.0f} s later"
    )
    assert held <= {r["run"] for r in results}
    check(results)
    # each run the dead instance held finished once: one final checkpoint for its run id
    client = get_sync_client(url=cluster.url(0))
    for r in (r for r in results if r["run"] in held):
        history = client.threads.get_history(r["thread"], limit=200)
        finals = [c for c in history if not c["next"] and c["metadata"].get("run_id") == r["run"]]
        assert len(finals) == 1, (r["run"], len(finals))
