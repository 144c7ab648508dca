"""The label-free tau: found where the known components' posteriors cross, refused when the
scores show no mode of unsure drafts, written as the gate file the labelled calibration
writes."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from helpers import draft, records_of, two_modes
from speceyes_graph import GateConfig
from speceyes_graph.calibration import draft_scores
from speceyes_graph.label_free import (
    UNSURE_BELOW,
    Mixture,
    NotBimodal,
    calibrate_unlabelled,
    fit_mixture,
    label_free_tau,
)


def misclassified(tau, weights, means, sds):
    """Share of drafts on the wrong side of tau under the true components."""
    phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    return weights[0] * (1 - phi((tau - means[0]) / sds[0])) + weights[1] * phi(
        (tau - means[1]) / sds[1]
    )


@pytest.mark.parametrize(
    "weights,means,sds",
    [((0.3, 0.7), (2.0, 9.0), (1.2, 1.5)), ((0.5, 0.5), (3.0, 7.0), (1.0, 1.0)),
     ((0.15, 0.85), (1.0, 8.0), (2.0, 1.0))],
)  # fmt: skip
def test_tau_lands_near_the_optimal_threshold(weights, means, sds):
    """Simulation with known components, 300 drafts, 40 runs: the optimal tau (fewest drafts
    on the wrong side) is where the true posteriors cross. Tolerance: every chosen tau within
    0.6 separability units of it (about half a component's spread) and at most 1.5 points
    more drafts on the wrong side."""
    optimal = Mixture(weights, means, sds, 0.0, 0).crossing(0.5)
    best = misclassified(optimal, weights, means, sds)
    for seed in range(40):
        tau, mixture, check = label_free_tau(
            two_modes(np.random.default_rng(seed), 300, weights, means, sds)
        )
        assert check.bimodal and mixture.means[0] < tau < mixture.means[1]
        assert abs(tau - optimal) < 0.6, (seed, tau, optimal)
        assert misclassified(tau, weights, means, sds) - best < 0.015


@pytest.mark.parametrize(
    "scores,reason",
    [
        (np.random.default_rng(1).normal(5, 2, 400), "BIC gain"),  # one Gaussian
        (np.random.default_rng(2).gamma(2.0, 1.5, 400), "overlap"),  # one skewed hump
        (two_modes(np.random.default_rng(3), 300, (0.5, 0.5), (8.5, 10.5), (0.4, 0.3)), "both modes are confident"),
        (two_modes(np.random.default_rng(4), 20, (0.5, 0.5), (2, 9), (1, 1)), "at least 30"),
        (two_modes(np.random.default_rng(5), 400, (0.02, 0.98), (1, 9), (1, 1)), "one component holds"),
    ],
)  # fmt: skip
def test_refuses_without_a_mode_of_unsure_drafts(scores, reason):
    with pytest.raises(NotBimodal) as exc:
        label_free_tau(scores)
    assert reason in str(exc.value) and "calibrate with labels" in str(exc.value)


def test_the_both_confident_rule_is_the_published_threshold():
    assert UNSURE_BELOW == pytest.approx(math.log(0.98 / 0.02) / 0.6)


def test_a_point_mass_of_identical_guesses():
    """The demo's small model gives every tiny-object query the same logits: its wrong drafts
    are one repeated score. The spread floor keeps the fit finite; tau sits just above."""
    rng = np.random.default_rng(6)
    scores = np.concatenate([np.full(100, 4.3), rng.normal(9, 0.9, 200)])
    tau, mixture, _ = label_free_tau(scores)
    assert (
        4.3 < tau < 6
        and mixture.sds[0] > 0
        and mixture.weights[0] == pytest.approx(1 / 3, abs=0.01)
    )


def test_posterior_and_target_acceptance_options():
    scores = two_modes(np.random.default_rng(7), 400, (0.3, 0.7), (2, 9), (1.2, 1.5))
    crossing = label_free_tau(scores)[0]
    assert label_free_tau(scores, posterior=0.99)[0] > crossing
    tau = label_free_tau(scores, target_acceptance=0.5)[0]
    assert (scores > tau).mean() == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError):
        label_free_tau(scores, posterior=1.5)


def test_fit_is_deterministic_and_orders_components():
    scores = two_modes(np.random.default_rng(8), 300, (0.6, 0.4), (9, 2), (1, 1))
    a, b = fit_mixture(scores), fit_mixture(scores[::-1])
    assert a == b and a.means[0] < a.means[1] and sum(a.weights) == pytest.approx(1)


def test_gate_file_is_the_labelled_one(tmp_path):
    """Same file, same loader: the graph's gate accepts exactly the drafts above the fitted
    separability; the file records the calibration distribution for drift checks."""
    scores = two_modes(np.random.default_rng(9), 300, (0.3, 0.7), (2, 9), (1.2, 1.5))
    records = records_of(scores)
    result = calibrate_unlabelled(records)
    path = tmp_path / "gate.json"
    result.save(path)
    gate = GateConfig.load(path)
    tau_s = result.calibration["tau_separability"]
    assert gate.tau == result.tau and math.log(gate.tau / (1 - gate.tau)) / 0.6 == pytest.approx(
        tau_s
    )
    accepted = [draft_scores(r, "min") > gate.tau for r in records]
    assert np.mean(accepted) == pytest.approx(result.calibration["accepted_of_drafts"])
    saved = json.loads(path.read_text())["gate"]
    assert saved["max_drop"] is None and saved["loss"].startswith("none")
    assert saved["distribution"]["n"] == 300 and len(saved["distribution"]["points"]) == 300
    assert (
        saved["mixture"]["bimodal"]
        and 0.9 < result.calibration["modelled_accuracy_of_accepted"] <= 1
    )


def test_tool_drafts_without_a_second_mode_shut_the_depth_gate():
    rng = np.random.default_rng(10)
    records = records_of(two_modes(rng, 300, (0.3, 0.7), (2, 9), (1.2, 1.5)))
    for r, s in zip(records[:150], rng.normal(9, 1, 150)):
        r["tool_draft"] = draft(s)
    result = calibrate_unlabelled(records)
    assert result.tau_depth == 1.0 and "BIC gain" in result.depth_mixture["refused"]
    for r, s in zip(records[:150], two_modes(rng, 150, (0.4, 0.6), (1, 9), (1, 1))):
        r["tool_draft"] = draft(s)
    result = calibrate_unlabelled(records)
    assert 0.5 < result.tau_depth < 1 and result.depth_distribution["n"] == 150


def _write_run(folder, records):
    folder.mkdir()
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_calibrate_unlabelled_command(tmp_path):
    _write_run(
        tmp_path / "run",
        records_of(two_modes(np.random.default_rng(11), 300, (0.3, 0.7), (2, 9), (1.2, 1.5))),
    )
    _write_run(tmp_path / "flat", records_of(np.random.default_rng(12).normal(5, 2, 300)))
    cmd = [sys.executable, "-m", "speceyes_graph.cli", "calibrate", "--unlabelled"]
    r = subprocess.run([*cmd, str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "two-component fit of 300 drafts" in r.stdout and "no guarantee" in r.stdout
    assert GateConfig.load(tmp_path / "run" / "gate.json").tau > 0.5
    r = subprocess.run([*cmd, str(tmp_path / "flat")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "refused" in r.stderr and "--max-drop" in r.stderr
    assert not (tmp_path / "flat" / "gate.json").exists()
