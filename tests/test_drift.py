"""Drift: the two-sample tests agree with a reference implementation, a gate file's summary
stands in for its calibration sample, and ``speceyes report --against`` warns when a run's
drafts have moved away from the gate's calibration (and only then)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from helpers import draft, records_of, two_modes
from speceyes_graph.gate.calibration import calibrate, draft_scores, gate_drift
from speceyes_graph.gate.drift import (
    MAX_POINTS,
    ScoreDistribution,
    check_drift,
    ks_two_sample,
    two_proportion_test,
)
from speceyes_graph.gate.label_free import calibrate_unlabelled
from speceyes_graph.gate.separability import acceptance_score


@pytest.mark.parametrize(
    "n,m,shift", [(50, 80, 0.0), (200, 300, 0.3), (30, 1000, 0.5), (500, 500, 0.05)]
)
def test_ks_agrees_with_scipy(n, m, shift):
    rng = np.random.default_rng(n + m)
    a, b = rng.normal(0, 1, n), rng.normal(shift, 1, m)
    d, p = ks_two_sample(a, b)
    ref = stats.ks_2samp(a, b, method="asymp")
    assert d == pytest.approx(ref.statistic, abs=1e-12)
    assert p == pytest.approx(ref.pvalue, abs=0.03)  # ours adds Stephens' small-sample term


def test_two_proportion_test():
    # 60/100 against 45/100: z = 0.15 / sqrt(0.525 * 0.475 * 0.02) = 2.1242
    assert two_proportion_test(60, 100, 45, 100) == pytest.approx(0.03365, abs=2e-4)
    assert two_proportion_test(0, 0, 3, 10) == 1.0 and two_proportion_test(5, 5, 7, 7) == 1.0


def test_summary_stands_in_for_the_sample():
    rng = np.random.default_rng(1)
    big, run = rng.normal(0, 1, 20_000), rng.normal(0.05, 1, 400)
    summary = ScoreDistribution.from_scores(big, acceptance_score(1.0))
    assert summary.n == 20_000 and len(summary.points) == MAX_POINTS
    assert summary.accepted == pytest.approx((big > 1.0).mean())
    d_full, p_full = ks_two_sample(run, big)
    d_sum, p_sum = ks_two_sample(run, summary.points, n_b=summary.n)
    assert d_sum == pytest.approx(d_full, abs=2 / MAX_POINTS) and p_sum == pytest.approx(
        p_full, abs=0.02
    )
    again = ScoreDistribution.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert again == summary


def test_check_drift_warns_only_when_something_moved():
    rng = np.random.default_rng(2)
    calibration = two_modes(rng, 400, (0.3, 0.7), (2, 9), (1, 1))
    tau = acceptance_score(5.5)
    reference = ScoreDistribution.from_scores(calibration, tau)
    same = check_drift(two_modes(rng, 300, (0.3, 0.7), (2, 9), (1, 1)), reference, tau)
    assert same.warnings == () and same.ks_pvalue > 0.01
    more_wrong = check_drift(two_modes(rng, 300, (0.6, 0.4), (2, 9), (1, 1)), reference, tau)
    assert len(more_wrong.warnings) == 2 and "acceptance of drafts moved" in more_wrong.warnings[1]
    # the upper mode slides but stays above tau: the distribution moved, acceptance did not
    slid = check_drift(two_modes(rng, 300, (0.3, 0.7), (2, 10.5), (1, 1)), reference, tau)
    assert len(slid.warnings) == 1 and "Kolmogorov-Smirnov" in slid.warnings[0]


def _write_run(folder, records):
    folder.mkdir()
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _demo_records(rng, n, weights):
    rows = records_of(two_modes(rng, n, weights, (2, 9), (1.2, 1.5)))
    for r in rows:
        r.update(route="draft-only", split="s", options=["x", "y"], expected="A", answer="A",
                 correct=True, latency_s=0.1, draft_correct=True)  # fmt: skip
    return rows


def test_report_against_a_gate_file(tmp_path):
    rng = np.random.default_rng(3)
    calibration = _demo_records(rng, 300, (0.3, 0.7))
    gate = tmp_path / "gate.json"
    calibrate_unlabelled(calibration).save(gate)
    _write_run(tmp_path / "like", _demo_records(rng, 300, (0.3, 0.7)))
    _write_run(tmp_path / "moved", _demo_records(rng, 300, (0.7, 0.3)))
    cmd = [sys.executable, "-m", "speceyes_graph.cli", "report", "--against", str(gate)]
    like = subprocess.run(
        [*cmd, str(tmp_path / "like")], capture_output=True, text=True, timeout=120
    )
    assert like.returncode == 0, like.stderr
    assert "## Drift against" in like.stdout and "No drift at level 0.01" in like.stdout
    assert "warning" not in like.stderr
    moved = subprocess.run(
        [*cmd, str(tmp_path / "moved")], capture_output=True, text=True, timeout=120
    )
    assert moved.returncode == 0, moved.stderr
    assert (
        "score distribution has moved" in moved.stderr
        and "acceptance of drafts moved" in moved.stderr
    )
    report = json.loads((tmp_path / "moved" / "report.json").read_text())
    assert report["drift"]["draft"]["ks_pvalue"] < 0.01 and len(report["warnings"]) == 2


def test_labelled_gate_files_record_the_distribution_too(tmp_path):
    rng = np.random.default_rng(4)
    records = records_of(two_modes(rng, 300, (0.3, 0.7), (2, 9), (1.2, 1.5)))
    for r in records:
        r["draft_correct"] = draft_score_is_high(r)
    result = calibrate(records, max_drop=0.05, delta=0.1)
    assert result.distribution["n"] == 300 and 0 < result.distribution["accepted"] < 1
    # tau is one draft's own score: the summary counts it as the gate does (rejected)
    gate_accepts = np.mean([draft_scores(r, "min") > result.tau for r in records])
    assert result.distribution["accepted"] == gate_accepts
    path = tmp_path / "gate.json"
    result.save(path)
    assert gate_drift(records, path)["warnings"] == []
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"gate": {"tau": 0.98}}))
    assert "records no calibration distribution" in gate_drift(records, old)["warnings"][0]


def draft_score_is_high(record):
    from speceyes_graph.gate.calibration import raw_draft_score

    return raw_draft_score(record, "min") > 5


def test_tool_drafts_are_checked_on_their_own(tmp_path):
    rng = np.random.default_rng(5)
    records = records_of(two_modes(rng, 300, (0.3, 0.7), (2, 9), (1.2, 1.5)))
    for r, s in zip(records[:200], two_modes(rng, 200, (0.4, 0.6), (1, 9), (1, 1))):
        r["tool_draft"] = draft(s)
    path = tmp_path / "gate.json"
    calibrate_unlabelled(records).save(path)
    later = records_of(two_modes(rng, 300, (0.3, 0.7), (2, 9), (1.2, 1.5)))
    for r, s in zip(later[:200], two_modes(rng, 200, (0.8, 0.2), (1, 9), (1, 1))):
        r["tool_draft"] = draft(s)
    drift = gate_drift(later, path)
    assert "tool drafts" in " ".join(drift["warnings"]) and drift["draft"]["warnings"] == []
