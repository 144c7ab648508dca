"""The SpecReason baseline: drafted steps scored by the large model, accepted at >= 7,
rewritten by the large model (with its code run in the sandbox) otherwise; batched."""

from __future__ import annotations

import json
from pathlib import Path

from langchain_core.messages import AIMessage

from helpers import deepeyes_agent, judge, question_of
from speceyes_graph import create_speceyes_graph
from speceyes_graph.graph.specreason import parse_score
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.protocol import message_text

PUBLISHED = json.loads(
    (Path(__file__).parent / "data" / "published_thyme_prompts.json").read_text()
)


def history(msgs) -> str:
    """The accepted steps so far (the assistant message before the new turn)."""
    return "".join(message_text(m) for m in msgs if isinstance(m, AIMessage))


def small_model():
    """Drafts a good first step, then (for 'bad' questions) a bad second step."""

    def respond(msgs):
        if not history(msgs):
            return "<think>The object is red; let me check."
        if "bad" in question_of(msgs):
            return "<think>Let me guess wildly.</think><answer>Z</answer>"
        return "</think><answer>A</answer>"

    return ScriptedChatModel(respond=respond)


def large_model():
    """Scores steps (9 for careful ones, 2 for guesses); writes code when it must step in,
    and answers from what the sandbox printed."""

    def respond(msgs):
        last = message_text(msgs[-1])
        if "evaluate the quality of the last reasoning step" in last:
            return "Score: 2" if "guess" in message_text(msgs[-2]) else "9"
        if "<sandbox_output>" in history(msgs):
            said = history(msgs).rsplit("<sandbox_output>", 1)[1].split("</sandbox_output>")[0]
            return f"</think><answer>{said.strip()}</answer>"
        if "evil" in question_of(msgs):
            return "<code>\n```python\nprint(open('/etc/passwd').read())\n```\n"
        return "<code>\n```python\nprint('B')\n```\n"

    return ScriptedChatModel(respond=respond)


def build(tools="thyme", **kw):
    small, large = kw.pop("small", small_model()), kw.pop("large", large_model())
    graph = create_speceyes_graph(
        judge=judge("no"), speculator=small, agent=large, tools=tools, mode="specreason", **kw
    ).compile()
    return graph, small, large


def test_score_parsing_is_the_published_first_digit():
    assert parse_score("Score: 8/9") == 8
    assert parse_score("seven") == 0
    assert parse_score("") == 0


def test_accepted_steps_stay_and_rejected_ones_are_rewritten_with_code(scene):
    graph, small, large = build()
    good, bad, evil = graph.batch(
        [
            {"question": "good: what colour?", "images": [scene]},
            {"question": "bad: what colour?", "images": [scene]},
            {"question": "bad evil: what colour?", "images": [scene]},
        ]
    )
    assert good["route"] == "specreason" and good["answer"] == "A"
    assert [s["accepted"] for s in good["agent_steps"]] == [True, True]
    assert bad["answer"] == "B", bad
    steps = bad["agent_steps"]
    assert [s["score"] for s in steps[:2]] == [9, 2] and not steps[1]["accepted"]
    [run] = steps[1]["tool_calls"]
    assert run["name"] == "python_sandbox" and run["stdout"].strip() == "B"
    assert steps[2]["answer"] == "B"  # the large model answered from the sandbox output
    [escape] = evil["agent_steps"][1]["tool_calls"]
    assert "No such file or directory" in escape["error"]
    assert evil.get("error") is None
    # the published verification prompt, after the drafted step as an assistant turn
    scoring = [m for m in large.received if PUBLISHED["specreason_verify"] == message_text(m[-1])]
    assert scoring and all(isinstance(m[-2], AIMessage) for m in scoring)
    assert all(kw.get("max_tokens") == 10 for kw in large.call_kwargs if kw.get("stop") is None)
    drafts = [kw["stop"] for kw in small.call_kwargs]
    assert all(stop == PUBLISHED["thyme_stop_strings"] for stop in drafts)


def test_specreason_with_the_deepeyes_protocol(scene):
    small = ScriptedChatModel(respond=lambda msgs: "<think>hmm, a guess</think>")
    large = deepeyes_agent(answer="C")
    scorer_and_agent = ScriptedChatModel(
        respond=lambda msgs: (
            "3" if "evaluate the quality" in message_text(msgs[-1]) else large.respond(msgs)
        )
    )
    graph, _, _ = build(tools="deepeyes", small=small, large=scorer_and_agent)
    out = graph.invoke({"question": "what colour?", "images": [scene]})
    assert out["answer"] == "C", out
    first = out["agent_steps"][0]
    assert not first["accepted"] and first["tool_calls"][0]["name"] == "image_zoom_in_tool"


def test_a_query_without_an_answer_stops_after_six_steps(scene):
    small = ScriptedChatModel(respond=lambda msgs: "<think>still thinking")
    graph, _, large = build(small=small, large=ScriptedChatModel(respond=lambda msgs: "8"))
    out = graph.invoke({"question": "good", "images": [scene]})
    assert len(out["agent_steps"]) == 6 and out["answer"] is None
    assert out["stop_reason"] == "step_limit, no answer"


def test_tiny_checkpoints_smoke_thyme_runs_and_the_methods_table(tiny_models, tmp_path):
    """`speceyes bench --tools thyme` in every mode on the tiny checkpoints (random weights:
    the text is noise, so this checks that every path runs and records), then `speceyes
    report --compare` puts the four methods in one table."""
    import subprocess
    import sys

    from speceyes_graph.benchmarks import generate_suite
    from speceyes_graph.benchmarks.runner import read_records

    suite = tmp_path / "suite"
    generate_suite(suite, 3, seed=1, max_side=400)
    folder = f"tiny:{tiny_models['large'].parent}"
    spec = ["--small", folder, "--large", folder]
    runs = {}
    for mode in ("agent", "small", "specreason", "speceyes"):
        out = tmp_path / mode
        r = subprocess.run(
            [sys.executable, "-m", "speceyes_graph.cli", "bench", "--benchmark", "synthetic",
             "--data", str(suite), "--out", str(out), "--mode", mode, "--tools", "thyme",
             "--max-new-tokens", "8", "--batch-size", "4", *spec],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        records = read_records(out)
        assert len(records) == 3 and not any(rec["error"] for rec in records), records
        runs[mode] = out
    assert {rec["route"] for rec in read_records(runs["specreason"])} == {"specreason"}
    steps = [s for rec in read_records(runs["specreason"]) for s in rec["agent_steps"]]
    assert steps and all(0 <= s["score"] <= 9 for s in steps)
    r = subprocess.run(
        [sys.executable, "-m", "speceyes_graph.cli", "report", str(runs["speceyes"]),
         "--baseline", str(runs["agent"]), "--compare", str(runs["small"]), str(runs["specreason"])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    table = r.stdout.split("## Methods compared", 1)[1]
    for method in ("agent only", "small model only", "SpecReason", "SpecEyes"):
        assert f"| {method}" in table
    assert "| SpecEyes | thyme | 0.95 |" in table


def test_specreason_needs_a_text_protocol():
    import pytest

    with pytest.raises(ValueError, match="text protocol"):
        create_speceyes_graph(
            speculator=small_model(), agent=large_model(), tools="vision", mode="specreason"
        )
