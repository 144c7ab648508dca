"""How many bytes a checkpointer stores per query (target: under 20 KB for an agentic 4K query).

Runs agentic queries on a textured 3840x2160 image (scripted judge and a DeepEyes-style agent
that thinks, zooms twice, so two crops come back, then answers) on one SQLite thread, and
prints the bytes the checkpointer wrote per query, with and without the question text, for
each way the image is sent (a path, a ``data:`` URL) and for short and long agent thoughts.
Before this package moved pixels out of state, one such query put 2.0 MB into the state.

LangGraph records each run's input as sent in an "input" checkpoint (it is how a run can
be replayed), so a ``data:`` URL is stored once there; ``durability="exit"`` writes only the
final checkpoint, whose state holds references.

    python3 scripts/bench_checkpoint.py [--queries 4]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=4)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
