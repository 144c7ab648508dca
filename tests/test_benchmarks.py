import base64
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_graph.benchmarks import (
    extract_choice,
    extract_yes_no,
    generate_suite,
    load_benchmark,
    pope_metrics,
    read_records,
    run_benchmark,
)
from speceyes_graph.benchmarks.report import auroc, build_report, write_report
from speceyes_graph.benchmarks.sweep import compare_gates, gates_table
from speceyes_graph.benchmarks.synthetic import COLOURS, make_query
from speceyes_graph.models import fake_logprobs

ROOT = Path(__file__).resolve().parents[1]


def png_bytes(colour=(10, 200, 30), size=(64, 48)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


# --- loaders ----------------------------------------------------------------------------------


def test_vstar_loader_shuffles_options_and_follows_the_answer(tmp_path):
    for split in ("direct_attributes", "relative_position"):
        (tmp_path / split).mkdir()
        for i in range(6):
            Image.new("RGB", (40, 30)).save(tmp_path / split / f"{i}.jpg")
            opts = (
                ["the right one", "wrong 1", "wrong 2", "wrong 3"]
                if split == "direct_attributes"
                else ["left", "right"]
            )
            (tmp_path / split / f"{i}.json").write_text(
                json.dumps({"question": f"q{i}?", "options": opts})
            )
    qs = list(load_benchmark("vstar", tmp_path))
    assert len(qs) == 12 and {q.split for q in qs} == {"direct_attributes", "relative_position"}
    for q in qs:
        correct = "the right one" if q.split == "direct_attributes" else "left"
        assert q.options["ABCD".index(q.expected)] == correct
        assert Path(q.image).exists()
    assert len({q.expected for q in qs if q.split == "direct_attributes"}) > 1  # not always "A"
    assert [q.options for q in load_benchmark("vstar", tmp_path)] == [
        q.options for q in qs
    ]  # fixed seed


def hr_rows(n=3):
    return [
        {
            "index": i,
            "question": f"What is {i}?",
            "answer": "ABCD"[i % 4],
            "category": "single",
            "A": "a",
            "B": "b",
            "C": "c",
            "D": "d",
            "cycle_category": "x",
            "image": base64.b64encode(png_bytes((i * 40, 0, 0))).decode(),
        }
        for i in range(n)
    ]


def test_hrbench_tsv_and_parquet(tmp_path):
    rows = hr_rows()
    header = list(rows[0])
    lines = ["\t".join(header)] + ["\t".join(str(r[h]) for h in header) for r in rows]
    (tmp_path / "hr_bench_4k.tsv").write_text("\n".join(lines) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hr_bench_8k.parquet")
    qs = list(load_benchmark("hrbench", tmp_path))
    assert [q.split for q in qs] == ["hr_bench_4k"] * 3 + ["hr_bench_8k"] * 3
    assert qs[1].expected == "B" and qs[1].options == ["a", "b", "c", "d"] and qs[0].image is None
    img = Image.open(io.BytesIO(qs[2].image_bytes()))
    assert img.getpixel((0, 0)) == (80, 0, 0)  # decoded lazily, on demand


def test_pope_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in ("adversarial", "popular", "random"):
        folder = tmp_path / "Full" / split
        folder.mkdir(parents=True)
        rows = [
            {
                "id": i,
                "question_id": i,
                "question": "Is there a cat?",
                "answer": "Yes" if i % 2 else "no",
                "image_source": "coco",
                "image": {"bytes": png_bytes(), "path": None},
                "category": split,
            }
            for i in range(4)
        ]
        pq.write_table(pa.Table.from_pylist(rows), folder / "data-00000.parquet")
    qs = list(load_benchmark("pope", tmp_path))
    assert len(qs) == 12 and {q.split for q in qs} == {"adversarial", "popular", "random"}
    assert qs[1].expected == "yes" and qs[0].expected == "no" and qs[0].options is None
    assert Image.open(io.BytesIO(qs[0].image_bytes())).size == (64, 48)


# --- synthetic ----------------------------------------------------------------------------------


def test_synthetic_suite_is_deterministic_and_v_star_shaped(tmp_path):
    a = generate_suite(tmp_path / "a", 12, seed=5, max_side=1920, progress=False)
    b = generate_suite(tmp_path / "b", 12, seed=5, max_side=1920, progress=False)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes()
    c = generate_suite(tmp_path / "c", 12, seed=6, max_side=1920, progress=False)
    assert (c / "direct_attributes" / "syn_00000.jpg").read_bytes() != (
        a / "direct_attributes" / "syn_00000.jpg"
    ).read_bytes()
    qs = list(load_benchmark("synthetic", a))
    assert len(qs) == 12 and {q.split for q in qs} == {
        "direct_attributes",
        "relative_position",
        "existence",
        "text_reading",
    }


@pytest.mark.parametrize("seed", range(12))
def test_ground_truth_boxes_land_on_the_object(seed):
    for small in (True, False):
        img, meta = make_query("direct_attributes", seed, small, max_side=3840)
        x1, y1, x2, y2 = meta["bbox"]
        centre = np.asarray(img)[(y1 + y2) // 2, (x1 + x2) // 2]
        assert (
            np.abs(centre.astype(int) - COLOURS[meta["answer_text"]]).max() <= 3
        )  # the object's colour
        side = min(meta["image_size"])
        assert ((x2 - x1) < 0.03 * side) == small and meta["needs_zoom"] == small
        img, meta = make_query("text_reading", seed, small, max_side=3840)
        x1, y1, x2, y2 = meta["bbox"]
        crop = np.asarray(img)[y1:y2, x1:x2]
        assert (crop.min(axis=-1) < 60).any()  # the dark text is inside the sign's box
        img, meta = make_query("relative_position", seed, small, max_side=3840)
        a, b = meta["bbox"], meta["bbox_other"]
        assert meta["answer_text"] == ("left" if a[0] + a[2] < b[0] + b[2] else "right")


def test_existence_negatives_are_adversarial():
    negatives = 0
    for seed in range(30):
        _, meta = make_query("existence", seed, False)
        if meta["answer_text"] == "no":
            negatives += 1
            assert meta["bbox"] is None
    assert 5 < negatives < 25


# --- scoring --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, letter",
    [
        ("A", "A"),
        ("A.", "A"),
        ("(A)", "A"),
        ("A. red", "A"),
        ("<answer>A</answer>", "A"),
        ("red", "A"),
        ("The answer is B", "B"),
        ("Answer: (C)", "C"),
        ("C) green", "C"),
        ("dark red", "D"),
        ("D. dark red", "D"),
        ("It is dark red.", "D"),
        ("A blue car", "B"),
        ("A. blue", None),
        ("What a nice car", None),
        ("red or blue", None),
        ("", None),
        (None, None),
        ("<think>A?</think><answer>B</answer>", "B"),
        ("<answer>C", "C"),
    ],
)
def test_extract_choice(reply, letter):
    assert extract_choice(reply, ["red", "blue", "green", "dark red"]) == letter


@pytest.mark.parametrize(
    "reply, options, letter",
    [
        # options that read alike once punctuation goes (real HR-Bench rows): the explicit,
        # marked letter whose own option matches says which
        ("A. ELEVATE", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], "A"),
        ("B. ELEVATE.", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], "B"),
        ("(B) ELEVATE", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], "B"),
        ("<answer>A: ELEVATE</answer>", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], "A"),
        ("C. ELEVATE", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], None),  # C is LOWER
        ("ELEVATE", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], None),  # which of the two?
        ("A ELEVATE", ["ELEVATE", "ELEVATE.", "LOWER", "HOLD"], None),  # unmarked: no letter
        ("D. Zone 3", ["Zone 3", "zone 3", "Zone 4", "Zone 3."], "D"),
    ],
)
def test_a_marked_letter_decides_between_near_duplicate_options(reply, options, letter):
    assert extract_choice(reply, options) == letter


def test_yes_no_and_pope_metrics():
    assert [
        extract_yes_no(r)
        for r in ["Yes", "no.", "NO, there is none", "<answer>yes</answer>", "maybe", "", None]
    ] == ["yes", "no", "no", "yes", None, None, None]
    m = pope_metrics(
        [("yes", "yes"), ("yes", "no"), ("no", "no"), (None, "yes"), (None, "no"), ("no", "yes")]
    )
    assert m.n == 6 and m.accuracy == pytest.approx(2 / 6)
    assert m.precision == pytest.approx(1 / 2) and m.recall == pytest.approx(1 / 3)
    assert m.f1 == pytest.approx(
        2 * 0.5 * (1 / 3) / (0.5 + 1 / 3)
    ) and m.yes_ratio == pytest.approx(2 / 6)
    assert m.unreadable == 2


# --- runner: resume after a kill --------------------------------------------------------------------


def scripted_graph():
    return create_speceyes_graph(
        judge=judge("no"), speculator=speculator("A", 9.0), agent=deepeyes_agent()
    ).compile()


RUNNER = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{tests!r}]
    from helpers import judge, speculator, deepeyes_agent
    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.benchmarks import load_benchmark, run_benchmark
    from speceyes_graph.models import ScriptedChatModel
    from langchain_core.messages import AIMessage
    from speceyes_graph.models import fake_logprobs
    def slow(msgs):
        time.sleep(0.15)
        return AIMessage(content="A", response_metadata={{"logprobs": fake_logprobs(["A"], [9.0])}})
    g = create_speceyes_graph(judge=judge("no"), speculator=ScriptedChatModel(respond=slow), agent=deepeyes_agent()).compile()
    run_benchmark(g, load_benchmark("synthetic", {data!r}), {out!r}, mode="speceyes", concurrency=2, progress=False)
""")


def test_resume_after_a_kill_has_every_query_exactly_once(tmp_path):
    data = generate_suite(tmp_path / "syn", 16, seed=1, max_side=1280, progress=False)
    out = tmp_path / "run"
    code = RUNNER.format(tests=str(ROOT / "tests"), data=str(data), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (out / "records.jsonl").exists() and len(
            (out / "records.jsonl").read_bytes().splitlines()
        ) >= 4:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_records(out)
    assert 4 <= len(before) < 16
    with (out / "records.jsonl").open("a") as fh:  # as if killed in the middle of a write
        fh.write('{"id": "direct_attributes/syn_00099", "split": "dire')
    summary = run_benchmark(
        scripted_graph(),
        load_benchmark("synthetic", data),
        out,
        mode="speceyes",
        concurrency=4,
        progress=False,
    )
    after = read_records(out)
    ids = [r["id"] for r in after]
    assert len(ids) == 16 and len(set(ids)) == 16
    assert summary["written"] == 16 - len(before)
    assert all(line.endswith("}") for line in (out / "records.jsonl").read_text().splitlines())
    # a third run has nothing left to do
    assert (
        run_benchmark(
            scripted_graph(),
            load_benchmark("synthetic", data),
            out,
            mode="speceyes",
            progress=False,
        )["written"]
        == 0
    )
    assert len(json.loads((out / "run.json").read_text())["sessions"]) == 2


def test_runner_records_everything_and_survives_broken_images(tmp_path):
    data = generate_suite(tmp_path / "syn", 8, seed=2, max_side=1280, progress=False)
    broken = data / "direct_attributes" / "syn_00000.jpg"
    broken.write_bytes(broken.read_bytes()[:200])
    out = tmp_path / "run"
    graph = create_speceyes_graph(
        judge=judge(lambda q: "yes" if "written on the sign" in q else "no"),
        speculator=speculator("A", separability=lambda q: 4.0 if "left" in q else 9.0),
        agent=deepeyes_agent(answer="A"),
    ).compile()
    run_benchmark(graph, load_benchmark("synthetic", data), out, mode="speceyes", progress=False)
    records = {r["id"]: r for r in read_records(out)}
    assert len(records) == 8
    bad = records["direct_attributes/syn_00000"]
    assert "corrupt or truncated" in bad["error"] and bad["correct"] is False
    good = [r for r in records.values() if not r["error"]]
    assert {r["route"] for r in good} == {"speculative", "judged-agentic", "rejected-agentic"}
    for r in good:
        assert r["correct"] == (r["expected"] == "A")
        assert r["latency_s"] > 0 and "judge" in r["timings"]
        if r["route"] != "judged-agentic":
            assert len(r["draft"]["top_logprobs"][0]) == 64 and "token_scores" in r["draft"]
        if r["route"] != "speculative":
            assert r["agent_steps"][0]["tool_calls"][0]["box"] is not None
    # retry-errors re-runs only the failed query, still once per id
    broken.write_bytes((data / "direct_attributes" / "syn_00004.jpg").read_bytes())
    s = run_benchmark(
        graph,
        load_benchmark("synthetic", data),
        out,
        mode="speceyes",
        retry_errors=True,
        progress=False,
    )
    assert (
        s["written"] == 1
        and len(read_records(out)) == 8
        and not any(r["error"] for r in read_records(out))
    )


# --- report arithmetic on a hand-made file ------------------------------------------------------------


def rec(
    qid,
    route,
    correct,
    latency,
    *,
    sep=None,
    draft_correct=False,
    judge_s=0.1,
    spec_s=0.2,
    split="s1",
    error=None,
):
    draft = None
    if sep is not None:
        from speceyes_graph.gate.separability import GateConfig

        draft = {"text": "A", **GateConfig().evaluate(fake_logprobs(["A"], [sep]))}
    return {
        "id": qid,
        "split": split,
        "options": ["x", "y"],
        "expected": "A",
        "answer": "A",
        "correct": correct,
        "route": route,
        "draft": draft,
        "draft_correct": draft_correct,
        "latency_s": latency,
        "timings": {"judge": judge_s, **({"speculate": spec_s} if sep is not None else {})},
        "error": error,
    }


def write_run(folder, records, wall):
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "run.json").write_text(json.dumps({"sessions": [{"wall_s": wall}]}))


def test_report_arithmetic(tmp_path):
    ours = [
        rec("q1", "speculative", True, 0.3, sep=9.0, draft_correct=True),
        rec("q2", "speculative", False, 0.3, sep=8.0, draft_correct=False),
        rec("q3", "rejected-agentic", True, 2.3, sep=3.0, draft_correct=False),
        rec("q4", "judged-agentic", True, 2.1, split="s2"),
        rec("q5", None, False, 0.05, split="s2", error="judge: boom"),
    ]
    base = [rec(f"q{i}", "agent-only", True, 2.0, judge_s=0.0) for i in range(1, 6)]
    write_run(tmp_path / "ours", ours, wall=2.5)
    write_run(tmp_path / "base", base, wall=5.0)
    report = build_report(tmp_path / "ours", tmp_path / "base")
    s = report["summary"]
    assert s["n"] == 5 and s["accuracy"] == pytest.approx(3 / 5) and s["errors"] == 1
    assert (
        s["splits"]["s1"]["accuracy"] == pytest.approx(2 / 3)
        and s["splits"]["s2"]["accuracy"] == 0.5
    )
    assert s["beta"] == pytest.approx(3 / 4) and s["alpha"] == pytest.approx(2 / 3)
    assert s["ideal_speedup"] == pytest.approx(1 / (1 - 0.5))
    assert s["latency_mean_s"] == pytest.approx((0.3 + 0.3 + 2.3 + 2.1 + 0.05) / 5)
    assert s["latency_p50_s"] == pytest.approx(0.3)
    assert s["throughput_qps"] == pytest.approx(2.0) and s["speedup_wall"] == pytest.approx(2.0)
    assert s["accuracy_errors_dropped"] == pytest.approx(3 / 4)
    assert s["speedup_latency"] == pytest.approx(2.0 / 1.01)
    sw = report["sweep"]
    at = {c["tau"]: c for c in sw["curves"]["separability:min"]}
    # tau 0.98: q1 (S=9) and q2 (S=8) accepted, q3 (S=3) rejected
    # accuracy: q1 draft right, q2 draft wrong, q3..q5 take the agent's (right) answer
    assert at[0.98]["accuracy"] == pytest.approx(4 / 5) and at[0.98]["accepted"] == pytest.approx(
        2 / 5
    )
    modelled = (0.1 + 0.2) * 2 + (0.1 + 0.2 + 2.0) + (0.1 + 2.0) + (0.1 + 2.0)
    assert at[0.98]["speedup"] == pytest.approx(10.0 / modelled)
    assert at[0.995]["accepted"] == pytest.approx(
        1 / 5
    )  # sigmoid(0.6*9) = 0.99550 > 0.995 > sigmoid(0.6*8)
    assert at[0.999]["accepted"] == 0 and at[0.999]["accuracy"] == 1.0  # all fall back to the agent
    assert sw["auroc"]["separability_min"] == pytest.approx(
        1.0
    )  # the right draft has the top score


def test_compare_gates_arithmetic(tmp_path):
    """Named taus side by side, by the sweep's cost model, plus the accepted drafts' accuracy."""
    ours = [
        rec("q1", "speculative", True, 0.3, sep=9.0, draft_correct=True),
        rec("q2", "speculative", False, 0.3, sep=8.0, draft_correct=False),
        rec("q3", "rejected-agentic", True, 2.3, sep=3.0, draft_correct=False),
        rec("q4", "judged-agentic", True, 2.1),
    ]
    base = [rec(f"q{i}", "agent-only", True, 2.0, judge_s=0.0) for i in range(1, 5)]
    rows = compare_gates(ours, base, {"published": 0.98, "strict": 0.995, "label-free": None})
    published, strict, refused = rows
    assert published["accepted"] == 0.5 and published["accepted_of_drafts"] == pytest.approx(2 / 3)
    assert published["accepted_accuracy"] == 0.5 and published["accuracy"] == 0.75
    assert published["speedup"] == pytest.approx(8.0 / ((0.3 * 2) + 2.3 + 2.1))
    assert strict["accepted_accuracy"] == 1.0 and strict["accuracy"] == 1.0
    assert refused["tau"] is None and refused["agent_accuracy"] == 1.0
    table = gates_table(rows)
    assert "| label-free | refused |" in table and "| published | 0.98 | 0.500 / 0.667 |" in table


def test_auroc():
    assert auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.5], [True]) is None


def test_report_files_and_plots(tmp_path):
    rng = np.random.default_rng(0)
    ours = [
        rec(
            f"q{i}",
            "draft-only",
            bool(i % 2),
            0.2,
            sep=float(rng.uniform(3, 12)),
            draft_correct=bool(i % 2),
        )
        for i in range(20)
    ]
    base = [rec(f"q{i}", "agent-only", True, 1.0) for i in range(20)]
    write_run(tmp_path / "small", ours, wall=1.0)
    write_run(tmp_path / "agent", base, wall=4.0)
    report = write_report(tmp_path / "small", tmp_path / "agent")
    assert set(report["plots"]) == {
        "accuracy_vs_speedup.png",
        "separability_hist.png",
        "separability_vs_softmax_roc.png",
    }
    for p in report["plots"]:
        assert (tmp_path / "small" / p).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "small" / "report.md").read_text()
    assert "Offline gate sweep" in md and "AUROC" in md
    assert json.loads((tmp_path / "small" / "report.json").read_text())["summary"]["n"] == 20


def test_llm_judge_for_free_form_answers():
    from speceyes_graph.benchmarks.scoring import llm_judge
    from speceyes_graph.models import ScriptedChatModel

    seen = []

    def grader(messages):
        seen.append(messages[-1].content)
        return (
            "Yes." if "crimson" in messages[-1].content and "red" in messages[-1].content else "no"
        )

    model = ScriptedChatModel(respond=grader)
    assert llm_judge(model, "What colour is the car?", "red", "crimson") is True
    assert llm_judge(model, "What colour is the car?", "red", "blue") is False
    assert (
        llm_judge(model, "What colour is the car?", "red", None) is False
    )  # no answer: wrong, no call
    assert len(seen) == 2 and "Reference answer: red" in seen[0]
