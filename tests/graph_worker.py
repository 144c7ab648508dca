"""One graph worker of the multi-worker tests: ``python tests/graph_worker.py DSN NAME``.

It plays a LangGraph Platform queue worker: it takes the next run from the harness's queue
(a table in the shared Postgres; a thread's runs in order, each taken by whichever worker is
free), runs the chat graph on that thread with Postgres checkpoints and Postgres blobs, and
records the result. A run that another worker took and never finished (it was killed) is
taken again: if the thread's latest checkpoint belongs to that run, LangGraph resumes it
from there (``invoke(None)``), or reads the result if it had finished; else it starts over.

The models are scripted (tests/helpers.py): "big" questions are drafted ("A"), others go to
the agent ("B"), and a "slow" question makes the agent's first turn take two seconds, so
the test can kill a worker mid-run.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

QUEUE = """
CREATE TABLE IF NOT EXISTS harness_runs (
    id integer PRIMARY KEY, thread_id text NOT NULL, seq integer NOT NULL,
    question text NOT NULL, image text,
    status text NOT NULL DEFAULT 'pending', worker text, attempts integer NOT NULL DEFAULT 0,
    result jsonb, finished_by text, resumed boolean
)
"""

CLAIM = """
UPDATE harness_runs SET status = 'running', worker = %s, attempts = attempts + 1
WHERE id = (
    SELECT r.id FROM harness_runs r
    WHERE r.status = 'pending' AND NOT EXISTS (
        SELECT 1 FROM harness_runs p
        WHERE p.thread_id = r.thread_id AND p.seq < r.seq AND p.status <> 'done')
    ORDER BY r.id FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING id, thread_id, question, image
"""

FINISH = """
UPDATE harness_runs SET status = 'done', result = %s, finished_by = %s, resumed = %s
WHERE id = %s AND status = 'running' AND worker = %s
"""


def chat_graph(dsn: str):
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg_pool import ConnectionPool

    from helpers import deepeyes_agent, judge, speculator
    from speceyes_graph import create_speceyes_chat_graph
    from speceyes_graph.models import ScriptedChatModel
    from speceyes_graph.protocol import message_text
    from speceyes_tools import ImageStore, PostgresBlobs

    pool = ConnectionPool(dsn, kwargs={"autocommit": True, "prepare_threshold": 0}, max_size=4)
    saver = PostgresSaver(pool)
    agent = deepeyes_agent(answer="B")

    def slow_agent(messages):
        if "slow" in message_text(messages[0]) + message_text(messages[-1]):
            time.sleep(2.0)  # the window in which the test kills a worker
        return agent.respond(messages)

    graph = create_speceyes_chat_graph(
        judge=judge(lambda q: "no" if "big" in q else "yes"),
        speculator=speculator("A", 9.0),
        agent=ScriptedChatModel(respond=slow_agent),
        store=ImageStore(blobs=PostgresBlobs(dsn)),
    ).compile(checkpointer=saver)
    return graph


def run_one(graph, run_id: int, thread_id: str, question: str, image: str | None):
    from langchain_core.messages import HumanMessage

    config = {"configurable": {"thread_id": thread_id}, "metadata": {"harness_run": run_id}}
    state = graph.get_state(config)
    if state.metadata and state.metadata.get("harness_run") == run_id:  # taken before
        if state.next:
            return graph.invoke(None, config), True  # LangGraph resumes from the checkpoint
        return state.values, True  # it finished; only the record was lost
    content = [{"type": "text", "text": question}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": image}})
    return graph.invoke({"messages": [HumanMessage(content=content)]}, config), False


def main(dsn: str, name: str) -> None:
    import psycopg

    graph = chat_graph(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        idle_since = time.time()
        while time.time() - idle_since < 5:  # five idle seconds: the queue is drained
            row = conn.execute(CLAIM, (name,)).fetchone()
            if row is None:
                time.sleep(0.05)
                continue
            idle_since = time.time()
            run_id, thread_id, question, image = row
            out, resumed = run_one(graph, run_id, thread_id, question, image)
            messages = out["messages"]
            result = {
                "answer": messages[-1].content,
                "route": out.get("route"),
                "error": out.get("error"),
                "messages": len(messages),
                "last_question": messages[-2].text if len(messages) >= 2 else None,
            }
            conn.execute(FINISH, (json.dumps(result), name, resumed, run_id, name))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
