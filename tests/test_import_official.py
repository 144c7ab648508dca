"""Result files of the published SpecEyes scripts, imported as run folders that report,
calibrate (labelled and not) and the drift check read.

The files under ``tests/fixtures/official`` follow the scripts' line layouts and file names
(``tests/official_fixtures.py`` writes them): DeepEyes and Thyme, V*, HR-Bench and POPE,
SpecEyes and ``--baseline`` runs, and one file of bad lines among good ones.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from official_fixtures import FOLDER, RUNS, file_name

from speceyes_graph.benchmarks.official_lines import (
    BadLine,
    OfficialRun,
    official_record,
    parse_result_name,
)
from speceyes_graph.benchmarks.official_results import import_official
from speceyes_graph.benchmarks.report import build_report
from speceyes_graph.benchmarks.runner import read_records
from speceyes_graph.cli import main
from speceyes_graph.gate.calibration import calibrate, raw_draft_score

HR8K = OfficialRun("hr", "hr_bench_8k", "speceyes", "min", 0.98)


def fixture(variant, bench, split, baseline=False) -> Path:
    tau, agg = next((r[4], r[5]) for r in RUNS if r[:3] == (variant, bench, split))
    sub = variant + ("-baseline" if baseline else "")
    return FOLDER / sub / file_name(variant, bench, split, tau, agg, baseline)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Every fixture run imported once: {(variant, bench, split, baseline): run folder}."""
    root = tmp_path_factory.mktemp("imported")
    out = {}
    for variant, bench, split, *_ in RUNS:
        for baseline in (False, True):
            folder = root / f"{variant}-{bench}-{split}-{'agent' if baseline else 'spec'}"
            result = import_official([fixture(variant, bench, split, baseline)], folder)
            assert not result.skipped, result.skipped
            out[(variant, bench, split, baseline)] = folder
    return out


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}")
def test_every_variant_imports_line_for_line(imported, run):
    """Routes follow each line's judge_tc and use_model; the baseline pairs query by query;
    drafts are score-only with the separability their score implies, under the script's
    aggregation only."""
    variant, bench, split, n, tau, agg = run[:6]
    lines = lines_of(fixture(variant, bench, split))
    records = read_records(imported[(variant, bench, split, False)])
    baseline = read_records(imported[(variant, bench, split, True)])
    assert len(records) == len(baseline) == n
    assert {r["id"] for r in records} == {r["id"] for r in baseline}
    assert {r["route"] for r in baseline} == {"agent-only"}
    expected_routes = [
        "judged-agentic"
        if x["judge_tc"] == "yes"
        else "speculative"
        if x["use_model"] == "small"
        else "rejected-agentic"
        for x in lines
    ]
    assert [r["route"] for r in records] == expected_routes
    mine = {"min": "min", "mean": "mean"}[agg]
    for r, x in zip(records, lines, strict=True):
        assert r["answer"] == x["result"]["pred_ans"]
        if x["judge_tc"] == "yes":
            assert r["draft"] is None and r["draft_correct"] is None
            continue
        d = r["draft"]
        assert d["score_only"] and d["score"] == x["confidence_score"] and d["aggregation"] == mine
        s = x["confidence_score"]
        assert raw_draft_score(r, mine) == pytest.approx(math.log(s / (1 - s)) / 0.6)
        assert raw_draft_score(r, "bottom-q") is None  # no log-probs: no other aggregation
        assert (d["score"] > tau) == d["accepted"] == (r["route"] == "speculative")
        if bench == "vstar":
            assert r["expected"] == "A"  # the scripts never shuffle V* options
        if r["route"] == "speculative" or variant == "deepeyes":
            assert d["text"] and isinstance(r["draft_correct"], bool)
        else:  # Thyme keeps no rejected draft's text
            assert d["text"] is None and r["draft_correct"] is None
    settings = json.loads((imported[(variant, bench, split, False)] / "run.json").read_text())
    s = settings["sessions"][0]["settings"]
    assert (s["benchmark"], s["threshold"], s["aggregation"], s["source"], s["variant"]) == (
        {"hr": "hrbench"}.get(bench, bench),
        tau,
        mine,
        "official",
        variant,
    )
    assert settings["sessions"][0]["wall_s"] > 0  # from the folder's latency_summary.json


def test_options_come_from_the_prompt_the_result_or_the_dataset(imported, tmp_path):
    deepeyes = read_records(imported[("deepeyes", "hr", "hr_bench_8k", False)])
    lines = lines_of(fixture("deepeyes", "hr", "hr_bench_8k"))
    for r, x in zip(deepeyes, lines, strict=True):  # read back from print_messages' prompt
        assert r["options"][ord(r["expected"]) - ord("A")] == x["result"]["answer_str"]
    thyme = read_records(imported[("thyme", "hr", "hr_bench_4k", False)])
    for r, x in zip(thyme, lines_of(fixture("thyme", "hr", "hr_bench_4k")), strict=True):
        assert [f"{chr(65 + i)}. {o}" for i, o in enumerate(r["options"])] == x["result"]["options"]
    # Thyme's accepted V* lines keep no prompt: scored against the right option alone, unless
    # the dataset is at hand (by image name, in the files' order, as the scripts read it)
    path = fixture("thyme", "vstar", "direct_attributes")
    alone = import_official([path], tmp_path / "alone")
    assert alone.notes["scored against the right option alone"] == sum(
        x["use_model"] == "small" for x in lines_of(path)
    )
    data = tmp_path / "vstar" / "direct_attributes"
    data.mkdir(parents=True)
    for x in lines_of(path):
        r = next(
            r for r in read_records(tmp_path / "alone") if r["id"].endswith(x["result"]["image"])
        )
        options = [x["result"]["answer"], "The object is purple.", "The object is grey."]
        (data / x["result"]["image"]).write_bytes(b"")
        (data / x["result"]["image"]).with_suffix(".json").write_text(
            json.dumps({"question": r["question"], "options": options})
        )
    full = import_official([path], tmp_path / "full", data=tmp_path / "vstar")
    assert not full.notes.get("scored against the right option alone")
    recs = {r["id"]: r for r in read_records(tmp_path / "full")}
    for x in lines_of(path):
        if x["use_model"] == "small":
            r = recs[f"direct_attributes/{x['result']['image']}"]
            assert r["options"][0] == x["result"]["answer"] and len(r["options"]) == 3


def test_scoring_is_ours_with_the_published_rule_beside_it():
    line = {
        "status": "success",
        "error": "",
        "small_answer": "",
        "confidence_score": -1,
        "use_model": "large",
        "judge_tc": "yes",
        "print_messages": [
            {"role": "system", "content": "..."},
            {"role": "user", "content": [{"type": "text", "text": (
                "Question: Which sign?\n        Options: \nA. ELEVATE\nB. ELEVATE.\nC. LOWER\n\n"
            )}]},
        ],
        "result": {"idx": 7, "question": "Which sign?", "answer": "B", "answer_str": "ELEVATE.",
                   "category": "single", "pred_ans": "B. ELEVATE."},
    }  # fmt: skip
    r = official_record(line, HR8K)
    assert (r["expected"], r["correct"], r["official_correct"]) == ("B", True, True)
    r = official_record({**line, "result": {**line["result"], "pred_ans": "ELEVATE"}}, HR8K)
    # which of the two ELEVATEs? ours cannot tell (wrong); the published rule defers to its
    # LLM grader (None)
    assert (r["correct"], r["official_correct"]) == (False, None)
    r = official_record({**line, "result": {**line["result"], "pred_ans": "A. LOWER BAR"}}, HR8K)
    assert (r["correct"], r["official_correct"]) == (False, True)  # the rule: any "B" in it


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"status": "error", "error": "CUDA out of memory"}, "status 'error' (CUDA out of memory)"),
        ({"confidence_score": 1.0}, "outside (0, 1)"),
        ({"confidence_score": 0.0}, "outside (0, 1)"),
        ({"confidence_score": float("nan")}, "not a number"),
        ({"confidence_score": True}, "not a number"),
        ({"use_model": "medium"}, "not small or large"),
        ({"result": "B"}, "result is not an object"),
        ({"judge_tc": "yes"}, "the small model answered a query the judge sent"),
        ({"confidence_score": 0.5}, "accepted with confidence_score 0.5 at threshold 0.98"),
        ({"use_model": "large"}, "rejected with confidence_score"),
    ],
)
def test_a_bad_line_says_why(change, reason):
    good = next(
        x for x in lines_of(fixture("deepeyes", "hr", "hr_bench_8k")) if x["use_model"] == "small"
    )
    official_record(good, HR8K)  # the line itself is fine
    with pytest.raises(BadLine, match=reason.replace("(", r"\(").replace(")", r"\)")):
        official_record({**good, **change}, HR8K)


def test_bad_lines_are_reported_and_skipped_never_fatal(tmp_path, capsys):
    path = next((FOLDER / "bad").glob("*.jsonl"))
    assert main(["import-official", str(path), "--out", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert "12 lines imported, 12 skipped" in out
    skipped = lines_of(tmp_path / "run" / "import-skipped.jsonl")
    reasons = [s["reason"] for s in skipped]
    for expected in (
        "status 'error' (Error processing sample: CUDA out of memory)",
        "missing field confidence_score",
        "missing field pred_ans",
        "confidence_score 1.0 is outside (0, 1)",
        "confidence_score 0.0 is outside (0, 1)",
        "confidence_score -0.25 is outside (0, 1)",
        "confidence_score is not a number: '0.99'",
        "HR-Bench answer is not a letter: 'E)'",
        "not JSON (JSONDecodeError)",
        "not a JSON object",
    ):
        assert expected in reasons, (expected, reasons)
    assert any(re.fullmatch(r"hr_bench_8k/\d+ again \(first in .*jsonl:1\)", r) for r in reasons)
    assert skipped[-1]["reason"].startswith("not JSON")  # the torn last line
    assert [s["line"] for s in skipped] == sorted(s["line"] for s in skipped)
    assert len(read_records(tmp_path / "run")) == 12
    assert "skipped" in err and "... and 7 more" in err
    # nothing to import at all: exit 2, said so
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    code = main(["import-official", str(tmp_path / "junk.jsonl"), "--out", str(tmp_path / "j"),
                 "--benchmark", "hr", "--split", "hr_bench_8k", "--tau", "0.98"])  # fmt: skip
    assert code == 2 and "no line could be imported" in capsys.readouterr().err


def test_file_names_say_what_the_run_was():
    assert parse_result_name(
        "x/hr_hr_bench_8k_DeepEyes-7B_Qwen3-VL-2B-Instruct_6_bottom20_0.97_K=32_PhaseIMs.jsonl"
    ) == {
        "benchmark": "hr", "split": "hr_bench_8k", "mode": "speceyes", "aggregation": "bottom20",
        "tau": 0.97, "k": 32, "large_model": "DeepEyes-7B", "small_model": "Qwen3-VL-2B-Instruct",
        "batch_size": 6, "phase1_small": True,
    }  # fmt: skip
    base = parse_result_name("vstar_relative_position_Thyme-RL_baseline_4_None_None.jsonl")
    assert (base["mode"], base["tau"], base["large_model"], base["split"]) == (
        "agent",
        None,
        "Thyme-RL",
        "relative_position",
    )
    assert parse_result_name("results.jsonl") == {}


def test_reimporting_gives_the_same_folder_and_a_run_of_ours_is_never_overwritten(tmp_path, capsys):
    path = fixture("deepeyes", "pope", "adversarial")
    import_official([path], tmp_path / "a")
    first = (tmp_path / "a" / "records.jsonl").read_bytes()
    import_official([path], tmp_path / "a")
    assert (tmp_path / "a" / "records.jsonl").read_bytes() == first
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "records.jsonl").write_text('{"id": "q1"}\n')
    (ours / "run.json").write_text(json.dumps({"sessions": [{"settings": {"mode": "speceyes"}}]}))
    assert main(["import-official", str(path), "--out", str(ours)]) == 2
    assert "holds a run that was not imported" in capsys.readouterr().err
    assert (ours / "records.jsonl").read_text() == '{"id": "q1"}\n'
    # files of different runs do not make one folder
    other = fixture("thyme", "pope", "random")
    assert main(["import-official", str(path), str(other), "--out", str(tmp_path / "b")]) == 2
    assert "not one run" in capsys.readouterr().err


def test_the_offline_sweep_at_the_scripts_tau_is_the_run_itself(imported):
    """Re-gating the imported drafts at the threshold the script used reproduces the run:
    same accepted drafts, same accuracy (the baseline's agent answered as the run's agent)."""
    run = imported[("deepeyes", "hr", "hr_bench_8k", False)]
    report = build_report(run, imported[("deepeyes", "hr", "hr_bench_8k", True)])
    curve = report["sweep"]["curves"]["separability:min"]
    at = next(c for c in curve if c["tau"] == 0.98)
    assert at["accuracy"] == pytest.approx(report["summary"]["accuracy"])
    assert at["accepted"] == pytest.approx(report["summary"]["routes"]["speculative"] / 300)
    assert list(report["sweep"]["curves"]) == ["separability:min"]  # no what-if without log-probs
    assert at["speedup"] is None and report["summary"]["speedup_wall"] > 1  # wall times only
    assert 0.5 < report["sweep"]["auroc"]["separability_min"] <= 1


def test_thyme_drafts_without_text_are_left_out_of_what_labels_claim(imported):
    run = imported[("thyme", "hr", "hr_bench_4k", False)]
    records, baseline = (
        read_records(run),
        read_records(imported[("thyme", "hr", "hr_bench_4k", True)]),
    )
    unknown = [r for r in records if r["draft"] and r["draft_correct"] is None]
    floor = max(r["draft"]["score"] for r in unknown)
    report = build_report(run, imported[("thyme", "hr", "hr_bench_4k", True)])
    for c in report["sweep"]["curves"]["separability:mean"]:
        assert (c["accuracy"] is None) == (c["tau"] < floor)
    gate = calibrate(records, max_drop=0.2, delta=0.2, baseline=baseline, aggregations=["mean"])
    assert gate.tau >= floor - 1e-6 and gate.calibration["unlabelled_drafts"] == len(unknown)


def test_the_commands_read_imported_runs(imported, tmp_path, capsys):
    spec = imported[("deepeyes", "hr", "hr_bench_8k", False)]
    agent = imported[("deepeyes", "hr", "hr_bench_8k", True)]
    assert main(["report", str(spec), "--baseline", str(agent), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "separability:min acc / accepted" in md and "| speedup_wall |" in md
    assert {p.name for p in (tmp_path / "r").glob("*.png")} == {
        "accuracy_vs_speedup.png", "separability_hist.png", "separability_vs_softmax_roc.png",
    }  # fmt: skip
    capsys.readouterr()
    gate = tmp_path / "gate.json"
    assert main(["calibrate", str(spec), "--max-drop", "0.02", "--baseline", str(agent),
                 "--out", str(gate)]) == 0  # fmt: skip
    assert json.loads(gate.read_text())["gate"]["aggregation"] == "min"
    lf = tmp_path / "label-free.json"
    assert main(["calibrate", str(spec), "--unlabelled", "--out", str(lf)]) == 0
    out = capsys.readouterr().out
    assert "two-component fit of 209 drafts" in out
    # HR-Bench 4K drafts were made unsurer (60% in the lower mode, not 35%): drift is flagged
    moved = imported[("deepeyes", "hr", "hr_bench_4k", False)]
    assert main(["report", str(moved), "--against", str(lf), "--out", str(tmp_path / "m")]) == 0
    assert "distribution has moved" in capsys.readouterr().err
    assert main(["report", str(spec), "--against", str(lf), "--out", str(tmp_path / "s")]) == 0
    assert "warning" not in capsys.readouterr().err
    # a Thyme run scored with mean: calibrate uses it, and refuses to invent another
    thyme = imported[("thyme", "hr", "hr_bench_4k", False)]
    assert (
        main(["calibrate", str(thyme), "--max-drop", "0.1", "--out", str(tmp_path / "t.json")]) == 0
    )
    assert "(mean, K 64)" in capsys.readouterr().out
    assert main(["calibrate", str(thyme), "--max-drop", "0.1", "--aggregations", "min"]) == 2
    assert "keep no log-probs" in capsys.readouterr().err


def test_softmax_scored_drafts_are_kept_as_such(tmp_path, capsys):
    """--mode log scores drafts by softmax confidence: the sweep draws that curve alone, and
    calibrate, which works on separability, says why it cannot use them."""
    src = fixture("deepeyes", "pope", "adversarial")
    renamed = tmp_path / src.name.replace("_min_", "_log_")
    renamed.write_bytes(src.read_bytes())
    import_official([renamed], tmp_path / "log")
    records = read_records(tmp_path / "log")
    drafts = [r["draft"] for r in records if r["draft"]]
    assert drafts and all(
        d["aggregation"] == "softmax" and d["separability"] is None for d in drafts
    )
    assert all(raw_draft_score(r, "min") is None for r in records)
    import_official([fixture("deepeyes", "pope", "adversarial", True)], tmp_path / "agent")
    report = build_report(tmp_path / "log", tmp_path / "agent")
    assert list(report["sweep"]["curves"]) == ["softmax:geo-mean"]
    assert main(["calibrate", str(tmp_path / "log"), "--unlabelled"]) == 2
    assert "softmax confidence" in capsys.readouterr().err
