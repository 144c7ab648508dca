"""The label-free tau: by default the lowest tau whose accepted drafts' accuracy, as the fitted
mixture estimates it, reaches a level (checked in simulation against the truth, with the
tolerance measured); the crossing of the known components' posteriors as an option; refused
when the scores show no mode of unsure drafts; written as the gate file the labelled
calibration writes.

``.venv/bin/python tests/test_label_free.py [SEEDS]`` prints the simulation's table (the one in
docs/calibration.md, 400 seeds) with the crossing and the published tau beside it."""

import json
import math
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from helpers import draft, records_of, two_modes
from speceyes_graph import GateConfig
from speceyes_graph.gate.calibration import draft_scores
from speceyes_graph.gate.label_free import (
    DEFAULT_MIN_ACCURACY,
    UNSURE_BELOW,
    LevelNotReached,
    Mixture,
    NotBimodal,
    bimodality,
    calibrate_unlabelled,
    fit_mixture,
    label_free_tau,
    min_accuracy_tau,
    modelled_accuracy_curve,
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
def test_the_crossing_lands_near_the_optimal_threshold(weights, means, sds):
    """The crossing rule (``rule="crossing"``). Simulation with known components, 300
    drafts, 40 runs: the optimal tau (fewest drafts on the wrong side) is where the true
    posteriors cross. Tolerance: every chosen tau within 0.6 separability units of it (about
    half a component's spread) and at most 1.5 points more drafts on the wrong side."""
    optimal = Mixture(weights, means, sds, 0.0, 0).crossing(0.5)
    best = misclassified(optimal, weights, means, sds)
    for seed in range(40):
        tau, mixture, check = label_free_tau(
            two_modes(np.random.default_rng(seed), 300, weights, means, sds), rule="crossing"
        )
        assert check.bimodal and mixture.means[0] < tau < mixture.means[1]
        assert abs(tau - optimal) < 0.6, (seed, tau, optimal)
        assert misclassified(tau, weights, means, sds) - best < 0.015


# --- the default rule in simulation: shapes like real drafts, truth = the drawing component


def skew_normal(rng: np.random.Generator, n: int, a: float, loc: float, scale: float):
    """Azzalini's skew-normal (shape ``a``: > 0 a right tail), from two normals."""
    d = a / math.sqrt(1 + a * a)
    return loc + scale * (
        d * np.abs(rng.standard_normal(n)) + math.sqrt(1 - d * d) * rng.standard_normal(n)
    )


Sampler = Callable[[np.random.Generator, int], np.ndarray]
# name: (share of unsure drafts, unsure sampler, confident sampler). Unsure near 5 and
# confident near 8-10 on the separability scale, 30-40% unsure, as in real drafts; three
# Gaussian (one overlapping near the refusal criterion's edge) and three skewed: a gamma or
# skew-normal unsure mode (a long right tail into the confident range), a confident mode
# with Student-t tails or a long left tail.
SHAPES: dict[str, tuple[float, Sampler, Sampler]] = {
    "gaussian 35% N(5,1) vs N(9,1.3)": (
        0.35, lambda r, n: r.normal(5, 1.0, n), lambda r, n: r.normal(9, 1.3, n)),
    "gaussian 30% N(5,0.8) vs N(8.5,1.5)": (
        0.30, lambda r, n: r.normal(5, 0.8, n), lambda r, n: r.normal(8.5, 1.5, n)),
    "gaussian, overlapping 40% N(5,1.2) vs N(8,1)": (
        0.40, lambda r, n: r.normal(5, 1.2, n), lambda r, n: r.normal(8, 1.0, n)),
    "gamma unsure 35% 3+Gamma(4,0.5) vs N(9,1.3)": (
        0.35, lambda r, n: 3 + r.gamma(4, 0.5, n), lambda r, n: r.normal(9, 1.3, n)),
    "skew-normal unsure 40% SN(4;4.2,1.2) vs 9+t3": (
        0.40, lambda r, n: skew_normal(r, n, 4, 4.2, 1.2), lambda r, n: 9 + r.standard_t(3, n)),
    "both skewed 35% SN(4;4.2,1.2) vs SN(-4;10.3,2)": (
        0.35, lambda r, n: skew_normal(r, n, 4, 4.2, 1.2),
        lambda r, n: skew_normal(r, n, -4, 10.3, 2.0)),
}  # fmt: skip
LEVELS = (0.9, 0.95, 0.97, 0.99)
N_DRAFTS = 300


def simulate(shape: str, seeds: range, levels=LEVELS) -> dict:
    """For each run the criterion accepts: the true accuracy and the acceptance of the drafts
    above the min_accuracy tau at each level (None: that level refused), of the crossing's
    and of the published tau's. One fit per run serves every level: ``label_free_tau`` is
    that fit, the criterion and :func:`min_accuracy_tau` (checked in the test)."""
    unsure_share, unsure, confident = SHAPES[shape]
    out: dict = {"not_bimodal": 0, "levels": {lv: [] for lv in levels}, "crossing": [],
                 "published": []}  # fmt: skip
    for seed in seeds:
        rng = np.random.default_rng(seed)
        wrong = rng.random(N_DRAFTS) < unsure_share
        x = np.where(wrong, unsure(rng, N_DRAFTS), confident(rng, N_DRAFTS))
        mixture = fit_mixture(x)
        if not bimodality(x, mixture).bimodal:
            out["not_bimodal"] += 1
            continue
        for level in levels:
            tau, _ = min_accuracy_tau(x, mixture, level)
            out["levels"][level].append(None if tau is None else _truth(x, wrong, tau))
        out["crossing"].append(_truth(x, wrong, mixture.crossing(0.5)))
        out["published"].append(_truth(x, wrong, UNSURE_BELOW))
    return out


def _truth(x: np.ndarray, wrong: np.ndarray, tau: float | None) -> tuple[float, float]:
    """(true accuracy, share) of the drafts above tau."""
    assert tau is not None
    return 1 - float(wrong[x > tau].mean()), float((x > tau).mean())


# the worst shortfall (level - true accuracy) over runs 0-39 at any level, and the largest
# mean shortfall, as measured; the test allows 0.005 more (the numbers are deterministic)
TOLERANCE = {  # shape: (worst, mean)
    "gaussian 35% N(5,1) vs N(9,1.3)": (0.049, 0.001),
    "gaussian 30% N(5,0.8) vs N(8.5,1.5)": (0.044, 0.001),
    "gaussian, overlapping 40% N(5,1.2) vs N(8,1)": (0.096, 0.017),
    "gamma unsure 35% 3+Gamma(4,0.5) vs N(9,1.3)": (0.110, 0.049),
    "skew-normal unsure 40% SN(4;4.2,1.2) vs 9+t3": (0.178, 0.075),
    "both skewed 35% SN(4;4.2,1.2) vs SN(-4;10.3,2)": (0.078, 0.010),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_accepted_drafts_are_as_accurate_as_asked(shape):
    """40 runs of 300 drafts per shape; truth = the component that drew the draft. For each
    level in 0.9, 0.95, 0.97, 0.99 the accepted drafts' true accuracy is at least the level
    minus the tolerance, measured here as the worst shortfall over the runs (TOLERANCE):

    - Gaussian modes (the model's assumption): worst 0.044-0.049, mean shortfall <= 0.001
      (the estimate is unbiased; the spread is a 300-draft fit's); overlapping modes near the
      refusal criterion's edge: worst 0.096, mean 0.017;
    - a right-skewed unsure mode: the Gaussian fit misses the part of its tail that reaches
      into the confident range, so the estimate is optimistic: mean shortfall 0.049 (gamma)
      and 0.075 (skew-normal with a t3 confident mode), worst 0.110 and 0.178;
    - a right-skewed unsure mode against a left-skewed confident one: worst 0.078, mean 0.010.

    400 runs (docs/calibration.md) widen the worst cases (0.08-0.20); the mean shortfalls
    move by less than 0.01."""
    result = simulate(shape, range(40))
    worst_allowed, mean_allowed = TOLERANCE[shape]
    bimodal_runs = 40 - result["not_bimodal"]
    assert bimodal_runs >= 30
    for level, runs in result["levels"].items():
        reached = [accuracy for accuracy, _ in filter(None, runs)]
        assert len(reached) >= 0.75 * bimodal_runs, (level, len(reached))
        shortfall = level - np.asarray(reached)
        assert shortfall.max() <= worst_allowed + 0.005, (level, shortfall.max())
        assert shortfall.mean() <= mean_allowed + 0.005, (level, shortfall.mean())


def test_label_free_tau_is_the_fit_and_the_scan():
    unsure_share, unsure, confident = SHAPES["gamma unsure 35% 3+Gamma(4,0.5) vs N(9,1.3)"]
    rng = np.random.default_rng(0)
    x = np.where(rng.random(300) < unsure_share, unsure(rng, 300), confident(rng, 300))
    for level in LEVELS:
        tau, mixture, _ = label_free_tau(x, min_accuracy=level)
        assert tau == min_accuracy_tau(x, mixture, level)[0]
    assert label_free_tau(x)[0] == label_free_tau(x, min_accuracy=DEFAULT_MIN_ACCURACY)[0]


def reference_tau(scores, mixture, level):
    """The rule as written: candidates (midpoints of distinct scores, one unit below the
    lowest) from the highest down; the last before the first whose estimate falls short."""
    distinct = sorted(set(scores.tolist()), reverse=True)
    candidates = [(a + b) / 2 for a, b in zip(distinct, distinct[1:])] + [distinct[-1] - 1]
    tau = None
    for t in candidates:
        if mixture.posterior_upper(scores[scores > t]).mean() < level:
            break
        tau = t
    return tau


@pytest.mark.parametrize(
    "mixture",
    [Mixture((0.35, 0.65), (5.0, 9.0), (1.0, 1.3), 0.0, 0),
     Mixture((0.5, 0.5), (5.0, 8.0), (2.0, 0.7), 0.0, 0),  # the posterior falls again up high
     Mixture((0.3, 0.7), (4.3, 9.0), (0.05, 0.9), 0.0, 0)],
)  # fmt: skip
def test_min_accuracy_tau_is_the_rule_as_written(mixture):
    rng = np.random.default_rng(1)
    for _ in range(20):
        scores = np.round(rng.uniform(2, 13, int(rng.integers(5, 80))), 1)  # with ties
        for level in (0.5, 0.9, 0.99):
            tau, estimate = min_accuracy_tau(scores, mixture, level)
            assert tau == pytest.approx(reference_tau(scores, mixture, level))
            if tau is not None:
                assert not np.isin(tau, scores)  # never a draft's own score
                assert estimate == pytest.approx(
                    mixture.posterior_upper(scores[scores > tau]).mean()
                )
                assert estimate >= level


def test_no_tau_in_a_lucky_dip():
    """A wide lower component's Gaussian tail claims the very highest scores: the top drafts'
    estimate falls short while lower thresholds would pass. The rule refuses rather than pick
    a tau below a threshold that failed."""
    mixture = Mixture((0.5, 0.5), (5.0, 8.0), (2.0, 0.7), 0.0, 0)
    scores = np.array([12.5, 8.6, 8.4, 8.2, 8.0, 7.9, 7.7, 7.5, 5.0, 4.0, 3.0])
    candidates, estimates, accepted = modelled_accuracy_curve(scores, mixture)
    assert estimates[0] < 0.5 < estimates.max() and list(accepted[:3]) == [1, 2, 3]
    assert candidates[0] == pytest.approx((12.5 + 8.6) / 2)
    assert min_accuracy_tau(scores, mixture, 0.5) == (None, pytest.approx(estimates.max()))


def test_refuses_when_the_level_cannot_be_reached():
    """Bimodal drafts whose fitted lower component is the wider one: under the fit even the
    most confident drafts are unsure drafts with some probability, so no tau reaches 0.99."""
    scores = two_modes(np.random.default_rng(1), 300, (0.6, 0.4), (5.5, 8.3), (1.5, 0.6))
    tau, mixture, check = label_free_tau(scores, min_accuracy=0.9)
    assert check.bimodal and mixture.sds[0] > mixture.sds[1]
    with pytest.raises(LevelNotReached) as exc:
        label_free_tau(scores, min_accuracy=0.99)
    message, best = str(exc.value), exc.value.best
    assert isinstance(exc.value, NotBimodal) and exc.value.level == 0.99 and 0.9 <= best < 0.99
    assert "accuracy 0.99" in message and f"{best:.4f}" in message
    assert "calibrate with labels" in message
    records = records_of(scores)
    with pytest.raises(LevelNotReached):
        calibrate_unlabelled(records, min_accuracy=0.99)
    assert calibrate_unlabelled(records, min_accuracy=0.9).tau < 1


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
@pytest.mark.parametrize("rule", ["min_accuracy", "crossing"])
def test_refuses_without_a_mode_of_unsure_drafts(scores, reason, rule):
    with pytest.raises(NotBimodal) as exc:
        label_free_tau(scores, rule=rule)
    assert reason in str(exc.value) and "calibrate with labels" in str(exc.value)
    assert not isinstance(exc.value, LevelNotReached)


def test_the_both_confident_rule_is_the_published_threshold():
    assert UNSURE_BELOW == pytest.approx(math.log(0.98 / 0.02) / 0.6)


def test_a_point_mass_of_identical_guesses():
    """The demo's small model gives every tiny-object query the same logits: its wrong drafts
    are one repeated score. The spread floor keeps the fit finite; tau sits just above."""
    rng = np.random.default_rng(6)
    scores = np.concatenate([np.full(100, 4.3), rng.normal(9, 0.9, 200)])
    for rule in ("min_accuracy", "crossing"):
        tau, mixture, _ = label_free_tau(scores, rule=rule)
        assert (
            4.3 < tau < 6
            and mixture.sds[0] > 0
            and mixture.weights[0] == pytest.approx(1 / 3, abs=0.01)
        )


def test_choosing_the_rule():
    scores = two_modes(np.random.default_rng(7), 400, (0.3, 0.7), (2, 9), (1.2, 1.5))
    crossing = label_free_tau(scores, rule="crossing")[0]
    assert label_free_tau(scores, posterior=0.5)[0] == crossing  # posterior alone: crossing
    assert label_free_tau(scores, posterior=0.99)[0] > crossing
    assert label_free_tau(scores, rule="crossing", posterior=0.99)[0] > crossing
    default = label_free_tau(scores)[0]
    assert default == label_free_tau(scores, rule="min_accuracy", min_accuracy=0.99)[0]
    assert label_free_tau(scores, min_accuracy=0.9)[0] <= default
    tau = label_free_tau(scores, target_acceptance=0.5)[0]
    assert (scores > tau).mean() == pytest.approx(0.5, abs=0.01)
    for bad in (
        {"posterior": 1.5},
        {"min_accuracy": 1.0},
        {"min_accuracy": 0.9, "posterior": 0.5},  # two rules
        {"rule": "crossing", "min_accuracy": 0.9},
        {"rule": "target_acceptance"},
        {"rule": "median"},
    ):
        with pytest.raises(ValueError) as exc:
            label_free_tau(scores, **bad)
        assert not isinstance(exc.value, NotBimodal)


def test_fit_is_deterministic_and_orders_components():
    scores = two_modes(np.random.default_rng(8), 300, (0.6, 0.4), (9, 2), (1, 1))
    a, b = fit_mixture(scores), fit_mixture(scores[::-1])
    assert a == b and a.means[0] < a.means[1] and sum(a.weights) == pytest.approx(1)


def test_calibration_is_deterministic():
    records = records_of(two_modes(np.random.default_rng(8), 300, (0.35, 0.65), (5, 9), (1, 1.3)))
    a = calibrate_unlabelled(records)
    assert a == calibrate_unlabelled(records)
    assert calibrate_unlabelled(records[::-1]).tau == a.tau


def test_gate_file_is_the_labelled_one(tmp_path):
    """Same file, same loader: the graph's gate accepts exactly the drafts above the fitted
    separability; the file records the calibration distribution for drift checks and names
    the rule."""
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
    modelled = result.calibration["modelled_accuracy_of_accepted"]
    assert saved["mixture"]["bimodal"] and DEFAULT_MIN_ACCURACY <= modelled <= 1
    assert "rule min_accuracy 0.99" in saved["method"]
    assert saved["calibration"]["rule"] == "min_accuracy"
    assert saved["calibration"]["min_accuracy"] == 0.99
    assert saved["calibration"]["labelled_of_accepted"] == 0  # no labels in these records
    crossing = calibrate_unlabelled(records, posterior=0.5)
    assert "rule crossing" in crossing.method and crossing.calibration["posterior"] == 0.5
    accepting = calibrate_unlabelled(records, target_acceptance=0.5)
    assert "rule target_acceptance" in accepting.method


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
    assert "rule min_accuracy 0.99" in r.stdout and "no labels to check it against" in r.stdout
    assert GateConfig.load(tmp_path / "run" / "gate.json").tau > 0.5
    r = subprocess.run([*cmd, str(tmp_path / "flat")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "refused" in r.stderr and "--max-drop" in r.stderr
    assert not (tmp_path / "flat" / "gate.json").exists()


def test_the_command_prints_what_labels_say(tmp_path, capsys):
    """Labels never choose tau; where the records carry them (``draft_correct``; None is
    unknown and not counted) the command prints their accuracy of the accepted drafts beside
    the estimate, and the gate file keeps both."""
    from speceyes_graph.cli import main

    rng = np.random.default_rng(13)
    wrong = rng.random(300) < 0.35
    scores = np.where(wrong, 3 + rng.gamma(4, 0.5, 300), rng.normal(9, 1.3, 300))
    records = records_of(scores)
    for i, (r, w) in enumerate(zip(records, wrong, strict=True)):
        r["draft_correct"] = None if i % 10 == 0 else bool(not w)
    _write_run(tmp_path / "run", records)
    assert main(["calibrate", str(tmp_path / "run"), "--unlabelled"]) == 0
    out = capsys.readouterr().out
    cal = json.loads((tmp_path / "run" / "gate.json").read_text())["gate"]["calibration"]
    above = scores > cal["tau_separability"]
    known = above & (np.arange(300) % 10 != 0)
    assert cal["n_accepted"] == above.sum() and cal["labelled_of_accepted"] == known.sum()
    assert cal["labelled_accuracy_of_accepted"] == pytest.approx(1 - wrong[known].mean())
    assert (
        f"modelled accuracy of accepted drafts {cal['modelled_accuracy_of_accepted']:.3f}; "
        f"labels say {cal['labelled_accuracy_of_accepted']:.3f} "
        f"({known.sum()} of {above.sum()} labelled)"
    ) in out
    assert main(["calibrate", str(tmp_path / "run"), "--unlabelled", "--posterior", "0.5",
                 "--out", str(tmp_path / "crossing.json")]) == 0  # fmt: skip
    assert "rule crossing" in capsys.readouterr().out
    assert "rule crossing" in json.loads((tmp_path / "crossing.json").read_text())["gate"]["method"]
    wide_lower = two_modes(np.random.default_rng(1), 300, (0.6, 0.4), (5.5, 8.3), (1.5, 0.6))
    _write_run(tmp_path / "unreachable", records_of(wide_lower))  # see the test above
    assert main(["calibrate", str(tmp_path / "unreachable"), "--unlabelled"]) == 3
    assert "refused: no label-free tau at accuracy 0.99" in capsys.readouterr().err
    assert not (tmp_path / "unreachable" / "gate.json").exists()
    assert main(["calibrate", str(tmp_path / "run"), "--unlabelled", "--min-accuracy", "2"]) == 2
    with pytest.raises(SystemExit) as exc:  # one rule at a time
        main(["calibrate", str(tmp_path / "run"), "--unlabelled", "--min-accuracy", "0.9",
              "--posterior", "0.5"])  # fmt: skip
    assert exc.value.code == 2


def test_the_help_states_the_library_default():
    from speceyes_graph.cli import build_parser

    calibrate = build_parser()._subparsers._group_actions[0].choices["calibrate"]
    (action,) = [a for a in calibrate._actions if "--min-accuracy" in a.option_strings]
    assert action.default is None and f"LEVEL {DEFAULT_MIN_ACCURACY:g}" in action.help


def _table(seeds: int) -> str:
    """The simulation's table, Markdown: per shape, true accuracy of the accepted drafts
    (worst / 5th percentile / mean over the runs the criterion accepts) and acceptance."""
    levels = (0.9, 0.95, 0.97, 0.98, 0.99)
    head = "| shape | runs refused | " + " | ".join(f"level {lv:g}" for lv in levels)
    lines = [head + " | crossing | published tau 0.98 |", "|---" * (len(levels) + 4) + "|"]

    def cell(runs):
        acc = np.asarray([a for a, _ in runs])
        accept = np.mean([s for _, s in runs])
        return f"{acc.min():.3f} / {np.quantile(acc, 0.05):.3f} / {acc.mean():.3f} ({accept:.2f})"

    for shape in SHAPES:
        result = simulate(shape, range(seeds), levels)
        refused = [sum(r is None for r in result["levels"][lv]) for lv in levels]
        cells = [cell([r for r in result["levels"][lv] if r is not None]) for lv in levels]
        lines.append(
            f"| {shape} | {result['not_bimodal']} + {'/'.join(map(str, refused))} | "
            + " | ".join(cells)
            + f" | {cell(result['crossing'])} | {cell(result['published'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(_table(int(sys.argv[1]) if len(sys.argv) > 1 else 400))
