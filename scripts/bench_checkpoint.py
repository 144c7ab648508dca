"""How many bytes a checkpointer stores per query (target: under 20 KB for an agentic 4K query).

Runs agentic queries on a textured 3840x2160 image (scripted judge and a DeepEyes-style agent
that thinks, zooms twice, so two crops come back, then answers) on one SQLite thread, and
prints the bytes the checkpointer wrote per query, with and without the question text, for
each way the image is sent (a path, a ``data:`` URL) and for short and long agent thoughts.
Before this package moved pixels out of state, one such query put 2.0 MB into the state.

LangGraph records each run's input in an "input" checkpoint (it is how a run is resumed or
replayed); the graphs keep a ``data:`` URL there, as everywhere, as the ``blob://`` key of its
bytes in the image store. The second table pastes a 12 MP photo (4000x3000 JPEG) into the
plain graph and into the chat graph, on speculative and agentic queries, each run on a new
thread, and prints what the thread's checkpoints take per run (checkpoints, channel values
and saved writes) and how many stored rows hold image data (searched as bytes): SQLite, or
the Postgres database ``--postgres DSN`` names (as LangGraph's servers and Aegra store them;
its checkpoint tables are emptied first).

    python3 scripts/bench_checkpoint.py [--queries 4] [--postgres postgresql://...]
"""

from __future__ import annotations

import argparse
import base64
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from speceyes_graph import create_speceyes_graph
from speceyes_graph.models import ScriptedChatModel, fake_logprobs

QUESTION = "What is written on the small sign next to the red door?"


def textured_4k(path: Path) -> str:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (2160, 3840, 3), dtype=np.uint8)  # incompressible: worst case
    Image.fromarray(arr).save(path)
    return str(path)


def models(thought: str):
    from langchain_core.messages import AIMessage

    def agent(messages):
        turns = sum(1 for m in messages if m.type == "ai")
        if turns >= 2:
            return f"<think>{thought}</think><answer>A</answer>"
        box = [100 + 300 * turns, 100, 500 + 300 * turns, 400]
        call = json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box}})
        return f"<think>{thought}</think><tool_call>{call}</tool_call>"

    judge = ScriptedChatModel(respond=lambda m: "yes")
    speculator = ScriptedChatModel(
        respond=lambda m: AIMessage(
            content="A", response_metadata={"logprobs": fake_logprobs(["A"], [3.0])}
        )
    )
    return judge, speculator, ScriptedChatModel(respond=agent)


THOUGHTS = {
    "short": "The sign is too small to read; zoom in.",  # ~40 characters per turn
    "long": "Let me look closer at the region around the door. " * 8,  # ~400 per turn
}


def measure(
    ref: str, n: int, folder: Path, thought: str, durability: str, reuse_thread: bool
) -> dict[str, float]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    judge, speculator, agent = models(thought)
    db = folder / f"cp-{len(list(folder.glob('*.db')))}.db"
    conn = sqlite3.connect(db, check_same_thread=False)
    graph = create_speceyes_graph(judge=judge, speculator=speculator, agent=agent).compile(
        checkpointer=SqliteSaver(conn)
    )
    for i in range(n):
        cfg = {"configurable": {"thread_id": "bench" if reuse_thread else f"bench-{i}"}}
        out = graph.invoke(
            {"question": QUESTION, "images": [ref], "query_id": f"q{i}"}, cfg, durability=durability
        )
        assert out["error"] is None and len(out["agent_steps"]) == 3, out["error"]
    stored = conn.execute(
        "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
    ).fetchone()[0]
    writes = conn.execute("SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes").fetchone()[0]
    rows = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    state = graph.get_state(cfg).values  # the last query's
    conn.close()
    per_query = (stored + writes) / n
    question_bytes = len(QUESTION.encode()) * rows / n  # the question is in each checkpoint
    return {
        "checkpoints_per_query": rows / n,
        "bytes_per_query": per_query,
        "bytes_per_query_without_question": per_query - question_bytes,
        "final_state_bytes": len(json.dumps(state, default=str)),
        "base64_in_state": "base64" in json.dumps(state, default=str),
    }


def photo_12mp(path: Path) -> str:
    """A 4000x3000 photo-like JPEG (smooth shading, fine noise, quality 90): a few MB, as a
    phone's photo is."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:3000, 0:4000].astype(np.float32)
    base = np.stack([x / 16, y / 12, (x + y) / 28], axis=-1) % 256
    noise = rng.normal(0, 12, (3000, 4000, 3)).astype(np.float32)
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(path, quality=90)
    return str(path)


IMAGE_SIGNS = (b"data:image", b"/9j/", b"\xff\xd8\xff")  # a data: URL, JPEG in base64 or raw


def stored_rows(saver) -> list[tuple[str, bytes]]:
    """(thread, stored bytes) of every row a SQLite or Postgres checkpointer wrote."""
    if hasattr(saver.conn, "connection"):  # a psycopg pool: PostgresSaver
        with saver.conn.connection() as conn:
            return [
                (thread, bytes(data or b""))
                for query in (
                    "SELECT thread_id, convert_to(checkpoint::text || metadata::text, 'UTF8')"
                    " FROM checkpoints",
                    "SELECT thread_id, blob FROM checkpoint_blobs",
                    "SELECT thread_id, blob FROM checkpoint_writes",
                )
                for thread, data in conn.execute(query).fetchall()
            ]
    conn = saver.conn
    return [
        (thread, bytes(data or b""))
        for query in (
            "SELECT thread_id, checkpoint FROM checkpoints",
            "SELECT thread_id, metadata FROM checkpoints",
            "SELECT thread_id, value FROM writes",
        )
        for thread, data in conn.execute(query).fetchall()
    ]


def pasted(data_url: str, n: int, folder: Path, postgres: str | None) -> None:
    """Bytes per run of a thread's checkpoints when each run pastes ``data_url``."""
    from langchain_core.messages import HumanMessage

    from speceyes_graph import create_speceyes_chat_graph

    question = {"speculative": "Is there a door?", "agentic": QUESTION}
    print(
        f"\n{'graph':<7}{'route':<13}{'checkpointer':<14}{'KB/run':>8}{'rows with image data':>22}"
    )
    for kind in ("plain", "chat"):
        for route in ("speculative", "agentic"):
            saver, close = _saver(folder, postgres)
            _, speculator, agent = models(THOUGHTS["short"])
            judge = ScriptedChatModel(
                respond=lambda m, r=route: "no" if r == "speculative" else "yes"
            )
            settings = {"judge": judge, "speculator": speculator, "agent": agent}
            for i in range(n):
                cfg = {"configurable": {"thread_id": f"{kind}-{route}-{i}"}}
                if kind == "plain":
                    graph = create_speceyes_graph(**settings).compile(checkpointer=saver)
                    out = graph.invoke({"question": question[route], "images": [data_url]}, cfg)
                    assert out["error"] is None, out["error"]
                else:
                    graph = create_speceyes_chat_graph(**settings).compile(checkpointer=saver)
                    paste = {"type": "image_url", "image_url": {"url": data_url}}
                    turn = HumanMessage(content=[{"type": "text", "text": question[route]}, paste])
                    out = graph.invoke({"messages": [turn]}, cfg)
                    assert out["error"] is None, out["error"]
            rows = stored_rows(saver)
            close()
            with_image = sum(any(sign in data for sign in IMAGE_SIGNS) for _, data in rows)
            per_run = sum(len(data) for _, data in rows) / n
            print(
                f"{kind:<7}{route:<13}{'Postgres' if postgres else 'SQLite':<14}"
                f"{per_run / 1024:>8.1f}{with_image:>22}"
            )


def _saver(folder: Path, postgres: str | None):
    """(checkpointer, close) on a fresh SQLite file, or on the emptied Postgres database."""
    if postgres:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(postgres, kwargs={"autocommit": True, "prepare_threshold": 0})
        saver = PostgresSaver(pool)
        saver.setup()
        with pool.connection() as conn:
            conn.execute("TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes")
        return saver, pool.close
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(
        folder / f"pasted-{len(list(folder.glob('*.db')))}.db", check_same_thread=False
    )
    return SqliteSaver(conn), conn.close


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--postgres", help="a PostgreSQL DSN for the pasted-photo table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = textured_4k(folder / "textured-4k.png")
        data_url = "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()
        print(f"image: 3840x2160 random texture, {Path(path).stat().st_size / 2**20:.1f} MiB PNG")
        print(
            f"{'image':<11}{'thoughts':<9}{'durability':<11}{'thread':<8}"
            f"{'ckpts/q':>8}{'KB/q':>8}{'KB/q w/o question':>19}{'state KB':>10}  pixels in state"
        )
        runs = [
            ("path", path, "short", "async"),
            ("path", path, "long", "async"),
            ("data: URL", data_url, "long", "async"),
            ("data: URL", data_url, "long", "exit"),
        ]
        for name, ref, thoughts, durability in runs:
            for reuse in (False, True):
                r = measure(ref, args.queries, folder, THOUGHTS[thoughts], durability, reuse)
                print(
                    f"{name:<11}{thoughts:<9}{durability:<11}{'reused' if reuse else 'new':<8}"
                    f"{r['checkpoints_per_query']:>8.1f}{r['bytes_per_query'] / 1024:>8.1f}"
                    f"{r['bytes_per_query_without_question'] / 1024:>19.1f}"
                    f"{r['final_state_bytes'] / 1024:>10.1f}  {r['base64_in_state']}"
                )
    print(
        "target: under 20 KB per agentic query (question text excluded). On a reused thread\n"
        "LangGraph's input checkpoints also hold the previous query's final state until intake\n"
        "resets it (SqliteSaver stores whole snapshots), hence the larger figures there."
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        photo = Path(photo_12mp(folder / "photo-12mp.jpg"))
        data_url = "data:image/jpeg;base64," + base64.b64encode(photo.read_bytes()).decode()
        print(
            f"\npasted: a 4000x3000 photo, {photo.stat().st_size / 2**20:.1f} MiB JPEG, "
            f"{len(data_url) / 2**20:.1f} MiB as a data: URL"
        )
        pasted(data_url, args.queries, folder, args.postgres)
    print(
        "target: no row with image data; a run's checkpoints as small as with a path. The\n"
        "server keeps the request itself with the run (Aegra: runs.input and\n"
        "runs.execution_params), a data: URL's size each: docs/deployment.md."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
