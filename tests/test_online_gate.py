"""The online gate (speceyes_graph.gate.online): its estimate of a window's risk is unbiased
from the labels production gives (rejected drafts and shadowed accepted ones, each weighted
by the chance it was shadowed with), its bound is exact (never below its level), it never
accepts more than those labels support, it starts guarded (cold: accepting nothing until
its window can certify; warm: from a gate file's labelled evidence), and on simulated
traffic with and without drift its acceptance against the best fixed tau in hindsight, its
realised risk and its agent calls stay within what ``scripts/bench_online_gate.py``
measured (docs/calibration.md). Then ``speceyes replay-online`` on the official-shape
fixtures."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest

from speceyes_graph.benchmarks.online_replay import (
    SCENARIOS,
    Segment,
    replay,
    simulated_evidence,
    simulated_stream,
    summarise,
)
from speceyes_graph.gate.online import (
    BudgetShadows,
    LabelOptions,
    MarginShadows,
    OnlineGate,
    RiskOptions,
    TrustOptions,
    count_upper_bound,
    default_taus,
    upper_bound,
)
from speceyes_graph.gate.rolling import RollingControl
from speceyes_graph.gate.separability import acceptance_score

TARGET = 0.02
# The three figures per 3,000-query workload at the gate's defaults, as
# scripts/bench_online_gate.py measured them over 10 seeds (docs/calibration.md: worst over
# workloads and seeds; the medians are 0.97-1.01 of hindsight, the mean risk 0.96-1.04 of
# the target), each with a stated margin; (cold start, warm start).
ACCEPTANCE_FACTOR = {"cold": 0.7, "warm": 0.7}  # measured worst 0.84, 0.86 of hindsight
RISK_FACTOR = {"cold": 1.75, "warm": 1.6}  # measured worst 1.27x, 1.38x the target
EXTRA_CALLS = 0.4  # calls per query beyond the hindsight tau's fallbacks: measured 0.32


@pytest.mark.parametrize("shadows", [0.2, BudgetShadows(0.1), MarginShadows(0.6, 0.1)], ids=repr)
def test_the_window_estimate_is_unbiased_and_its_bound_holds(shadows):
    """Over seeds, the gate's estimate of its window's risk at fixed candidate taus matches
    the window's true risk on average (the labels of accepted drafts come only from shadows,
    each weighted by its chance), and the bound is above the truth in most windows: for a
    flat policy, a budget one (the chance follows the gate's acceptance) and one that looks
    at the score (pooled, its near-tau labels would overstate the risk)."""
    taus = np.array([0.95, 0.98, 0.99, 0.995])  # the gate's tau ends near 0.99
    errors, covered = [], []
    for seed in range(10):
        stream = simulated_stream([Segment("w", 1200, 0.15)], seed)
        gate = OnlineGate(
            TARGET,
            shadows,
            tau=0.98,
            risk=RiskOptions(window=1000, warmup=300),
            labels=LabelOptions(seed=seed),
        )
        replay(stream, gate, seed=seed)
        estimate, bound = gate.risk_bounds()
        window = stream[-1000:]
        truth = np.array(
            [
                sum(q.disagrees for q in window if q.score is not None and q.score > t) / 1000
                for t in taus
            ]
        )
        at = [list(gate.taus).index(t) for t in taus]
        errors.append(estimate[at] - truth)
        covered.append(bound[at] >= truth)
    errors_ = np.array(errors)
    se = errors_.std(axis=0, ddof=1) / np.sqrt(len(errors_))
    assert np.all(np.abs(errors_.mean(axis=0)) <= 3 * se + 1e-4), (errors_.mean(axis=0), se)
    assert np.mean(covered) >= 0.8


def test_the_bound_is_exact_where_the_normal_approximation_was_not():
    """The chance that the bound falls below the true share, computed exactly over every
    outcome of the binomial, is at most its level for every share and sample size (the
    Agresti-Coull bound it replaced missed 14% at a nominal 10% with no error seen), and it
    is Clopper-Pearson's (scipy's beta quantile)."""
    from scipy.stats import beta, binom

    delta = 0.1
    for trials in (5, 30, 100, 400):
        errors = np.arange(trials + 1)
        bounds = upper_bound(errors, np.full(trials + 1, trials), delta)
        reference = np.where(
            errors < trials, beta.ppf(1 - delta, errors + 1, np.maximum(trials - errors, 1)), 1.0
        )
        assert np.allclose(bounds, reference, atol=1e-9)
        for share in np.linspace(0.001, 0.2, 200):
            missed = binom.pmf(errors, trials, share)[bounds < share].sum()
            assert missed <= delta + 1e-12, (trials, share, missed)


def test_the_count_bound_is_exact_for_a_sample_without_replacement():
    """The gate's bound on a group's disagreements from its shadowed sample: the chance it
    falls below the true count, computed exactly over every outcome of the hypergeometric,
    is at most its level for every true count; it is the inverted test (scipy's
    hypergeometric), counts a fully labelled group exactly, and is tighter than
    Clopper-Pearson's share times the group (the bound it replaced)."""
    from scipy.stats import hypergeom

    delta = 0.1
    for population, sample in ((20, 5), (60, 30), (200, 100), (300, 90)):
        errors = np.arange(sample + 1)
        bounds = count_upper_bound(
            errors, np.full_like(errors, sample), np.full_like(errors, population), delta
        )
        reference = [
            max(k for k in range(m, population - sample + m + 1)
                if hypergeom.cdf(m, population, k, sample) >= delta)
            for m in errors
        ]  # fmt: skip
        assert list(bounds) == reference
        for true in range(population + 1):
            missed = hypergeom.pmf(errors, population, true, sample)[bounds < true].sum()
            assert missed <= delta + 1e-12, (population, sample, true, missed)
        clopper = upper_bound(errors, np.full_like(errors, sample), delta) * population
        assert np.all(bounds <= clopper + 1e-9) and bounds[0] < clopper[0] - 1
    full = count_upper_bound(np.array([0, 7]), np.array([50, 50]), np.array([50, 50]), delta)
    assert list(full) == [0, 7]
    assert count_upper_bound(np.array([0]), np.array([0]), np.array([40]), delta)[0] == 40


def test_the_window_counts_a_fully_shadowed_group_exactly():
    """Accepted drafts all shadowed (chance 1.0, as ``MarginShadows(1.0, ...)`` gives those
    near tau): the window's bound is its count, no slack; half shadowed, the bound is the
    hypergeometric one on the group's count (3 with none of 200 seen wrong, where
    Clopper-Pearson's share would allow 4.6)."""
    from speceyes_graph.gate.ledger import Observation
    from speceyes_graph.gate.window import window_risk

    taus = np.array([0.9])
    full = [Observation(i, 0.95, True, True, i < 4, chance=1.0) for i in range(400)]
    estimate, bound = window_risk(full, taus, 0.1)
    assert estimate[0] == bound[0] == 4 / 400
    half = [Observation(i, 0.95, True, i % 2 == 0, False if i % 2 == 0 else None, chance=0.5)
            for i in range(400)]  # fmt: skip
    estimate, bound = window_risk(half, taus, 0.1)
    assert estimate[0] == 0 and bound[0] == 3 / 400


def test_without_labels_it_accepts_no_more_than_the_tolerance_allows():
    """Every shadow run fails (no label of an accepted draft ever arrives): the gate cannot
    tell whether accepted drafts are right, so it may accept only as many as its tolerance
    could lose entirely (``tolerance * max_risk`` of the window; tau moves as the window's
    count catches up with its decisions, hence the margin)."""
    stream = simulated_stream([Segment("w", 3000, 0.15)], 0)
    gate = OnlineGate(TARGET, 0.1, risk=RiskOptions(window=1000), labels=LabelOptions(seed=0))
    log = replay(stream, gate, lost_shadows=1.0)
    after = log.accepted[1200:]  # once the window holds no warm-up decisions
    assert sum(after) / len(after) <= TARGET * gate.tolerance + 0.005
    assert gate.state()["shadowed"] == 0


def test_a_new_gate_starts_guarded_cold_or_warm():
    """V*-like traffic first, where the published 0.98 loses more than the target. Cold (no
    evidence): nothing accepted until the window can certify (its warm-up, ln(1/delta) /
    max_risk queries), then drafts are. Warm (a gate file's labelled queries): guarded from
    the first query (within its tolerance), and accepting from it. Started at 0.98 instead,
    the warm-up's queries, unguarded, lose more than the target."""
    vstar = SCENARIOS["abrupt"][0][0]
    stream = simulated_stream([vstar], 0)[:600]

    def first(gate, n=300):
        log = replay(stream, gate, seed=0)
        return log, sum(log.loss[:n]) / n, sum(log.accepted[:n]) / n

    cold = OnlineGate(TARGET, labels=LabelOptions(seed=0), trust=TrustOptions(store=None))
    assert cold.warmup == 116 and cold.start_tau == 1.0
    log, risk, _ = first(cold)
    assert not any(log.accepted[: cold.warmup]) and any(log.accepted[cold.warmup :])
    assert risk <= TARGET
    evidence = simulated_evidence(vstar, 500, 99)
    warm = OnlineGate(
        TARGET, evidence=evidence, labels=LabelOptions(seed=0), trust=TrustOptions(store=None)
    )
    assert warm.tau < 1.0 and warm.state()["seeded"] == 500  # certified before any query
    log, risk, accepted = first(warm)
    assert any(log.accepted[:50]) and risk <= TARGET * warm.tolerance and accepted > 0.1
    unguarded = OnlineGate(
        TARGET, tau=0.98, labels=LabelOptions(seed=0), trust=TrustOptions(store=None)
    )
    assert first(unguarded, cold.warmup)[1] > TARGET


def test_a_gate_file_keeps_its_labelled_evidence(tmp_path):
    """``speceyes calibrate`` writes the calibration queries (separability, disagrees) into
    the gate file; a gate built from the file starts from them."""
    rows = [[s, y] for s, y in simulated_evidence(SCENARIOS["none"][0][0], 400, 3)]
    path = tmp_path / "gate.json"
    gate_file = {"tau": 0.99, "k": 64, "aggregation": "min", "evidence": rows}
    path.write_text(json.dumps({"gate": gate_file}))
    gate = OnlineGate(TARGET, config=path, trust=TrustOptions(store=None))
    assert gate.state()["seeded"] == 400 and gate.tau < 0.99
    # a file from calibrate before it marked its scale keeps acceptance scores: read back as
    # the same queries, so the same tau (read as separability, every tau looked safe)
    old = [[None if s is None else acceptance_score(s), y] for s, y in rows]
    path.write_text(json.dumps({"gate": {**gate_file, "evidence": old}}))
    again = OnlineGate(TARGET, config=path, trust=TrustOptions(store=None))
    assert [q.score for q in again.seeds] == pytest.approx([q.score for q in gate.seeds])
    assert again.tau == gate.tau
    path.write_text(json.dumps({"gate": {**gate_file, "evidence_scale": "logits"}}))
    with pytest.raises(ValueError, match="evidence_scale"):
        OnlineGate(TARGET, config=path, trust=TrustOptions(store=None))
    path.write_text(json.dumps({"gate": {"tau": 0.99, "evidence": [["x", True]]}}))
    with pytest.raises(ValueError, match="evidence"):
        OnlineGate(TARGET, config=path, trust=TrustOptions(store=None))


def test_slow_labels_do_not_tighten_the_gate():
    """Shadow labels land seconds after the drafts they label. Until they do, the window
    stops at the oldest shadow in flight: a burst of accepted drafts whose shadowed cohort
    has no labels yet does not count as drafts the gate knows nothing about (the old gate
    rose from 0.5 to 1.0 on this burst and gated the demo's next drafts there); once the
    labels land they count; a shadow in flight past ``patience_s`` holds nothing."""
    evidence = [(8.0 + 0.01 * i, False) for i in range(300)]  # calibration: right drafts
    gate = OnlineGate(
        0.05, 0.5, evidence=evidence, labels=LabelOptions(seed=0), trust=TrustOptions(store=None)
    )
    start = gate.tau
    assert start < 0.9
    in_flight = []
    for i in range(100):
        decision = gate.decide(0.99)
        gate.observe(decision, 0.99, None, key=f"q{i}")  # a shadow's label: not yet
        if decision.shadowed:
            in_flight.append((f"q{i}", decision))
    assert len(in_flight) > 30 and gate.tau == start  # the burst waits for its labels
    first = int(in_flight[0][0][1:])  # the drafts before the first shadow count at once
    assert gate.state()["pending"] == 100 - first
    for key, decision in in_flight:
        gate.observe(decision, 0.99, False, key=key)  # the labels land
    assert gate.state()["pending"] == 0 and gate.tau == start
    estimate, _ = gate.risk_bounds()
    assert len(gate._evidence()) == 400 and estimate.max() == 0
    stuck = replace(gate.decide(0.99), shadowed=True, at=time.time() - 301)
    gate.observe(stuck, 0.99, None, key="lost")  # its worker died with it in flight
    for i in range(5):
        gate.observe(gate.decide(None), None, None, key=f"r{i}")
    assert gate.state()["pending"] == 1 and len(gate._evidence()) == 405


@pytest.fixture(scope="module")
def simulated():
    out = {}
    for start in ("cold", "warm"):
        for name, (segments, gradual) in SCENARIOS.items():
            stream = simulated_stream(segments, 101, gradual)  # a seed the benchmark did not use
            evidence = simulated_evidence(segments[0], 500, 10_101) if start == "warm" else None
            gate = OnlineGate(
                TARGET,
                evidence=evidence,
                labels=LabelOptions(seed=101),
                trust=TrustOptions(store=None),
            )
            log = replay(stream, gate, seed=101)
            out[start, name] = summarise(stream, log, TARGET, default_taus(), 1000)
    return out


@pytest.mark.parametrize("start", ["cold", "warm"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_three_figures_on_drifting_traffic(simulated, scenario, start):
    """Acceptance against the best fixed tau in hindsight, realised risk, agent calls."""
    for part in simulated[start, scenario]["segments"]:
        assert part["acceptance_ratio"] >= ACCEPTANCE_FACTOR[start], part
        assert part["risk"] <= RISK_FACTOR[start] * TARGET, part
        assert part["agent_calls"] <= 1 - part["hindsight_acceptance"] + EXTRA_CALLS, part


def test_a_fixed_tau_does_not_keep_the_promise(simulated):
    """The reason for the online gate: the published 0.98 on the same V*-like traffic
    loses more than the target allows with its tolerance (3.6%); this gate, started cold,
    keeps its first workload within it and below the fixed tau's loss."""
    stream = simulated_stream(SCENARIOS["abrupt"][0][:1], 101)
    lost = sum(q.disagrees for q in stream if q.score is not None and q.score > 0.98)
    gated = simulated["cold", "abrupt"]["segments"][0]["risk"]
    assert lost / len(stream) > 1.5 * TARGET >= gated and gated < lost / len(stream)


def test_bad_settings_are_refused():
    bad = ({"max_risk": 0}, {"shadow_rate": 0})
    for kwargs in bad:
        with pytest.raises(ValueError):
            OnlineGate(**kwargs)
    for options, kwargs in (
        (RiskOptions, {"delta": 1}),
        (RiskOptions, {"window": 1}),
        (RiskOptions, {"tolerance": 0.5}),
        (RiskOptions, {"max_age_s": 0}),
        (LabelOptions, {"patience_s": 0}),
        (TrustOptions, {"outage_tau": 1.5}),
        (TrustOptions, {"max_share": 0}),
        (TrustOptions, {"burst_s": 0}),
    ):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            options(**kwargs)
    with pytest.raises(ValueError, match="warmup"):  # the default warm-up outgrows the window
        OnlineGate(0.02, risk=RiskOptions(window=50))
    with pytest.raises(ValueError, match="outage_tau"):  # the start tau stands in for it
        OnlineGate(0.02, tau=1.5)
    with pytest.raises(TypeError, match="window"):  # the flat keywords are gone: risk=
        OnlineGate(0.02, window=500)  # type: ignore[call-arg]
    for near, far, margin in ((0, 0.3, 1.5), (1.0, 1.2, 1.5), (1.0, 0.3, 0)):
        with pytest.raises(ValueError):
            MarginShadows(near, far, margin)


def test_replay_online_on_the_official_fixtures(tmp_path, capsys):
    """The published scripts' results (V*, then HR-Bench 4K and 8K) as one stream: a row
    per run and overall, labels said by source, the tau path in the JSON, the plot."""
    from official_fixtures import FOLDER

    from speceyes_graph.benchmarks.official_results import import_official
    from speceyes_graph.cli import main

    runs = []
    for name in ("vstar_direct_attributes", "hr_hr_bench_4k", "hr_hr_bench_8k"):
        [source] = (FOLDER / "deepeyes").glob(f"{name}_*.jsonl")
        import_official([source], tmp_path / name)
        runs.append(str(tmp_path / name))
    out = tmp_path / "replay.json"
    args = [*runs, "--max-risk", "0.02", "--shadow-rate", "0.2", "--shuffle", "3"]
    assert (
        main(["replay-online", *args, "--json", str(out), "--plot", str(tmp_path / "r.png")]) == 0
    )
    printed = capsys.readouterr().out
    for name in ("vstar_direct_attributes", "hr_hr_bench_4k", "hr_hr_bench_8k", "overall"):
        assert name in printed
    assert "against the agent's answer for" in printed and "the reference answer for" in printed
    # the published tau split each run's labels by score: said, with the risk of each
    assert "labels change source" in printed
    summary = json.loads(out.read_text())
    n = summary["overall"]["queries"]
    assert n == sum(p["queries"] for p in summary["segments"]) == len(summary["tau_path"])
    for part in summary["segments"]:
        sources = part["labels"]
        assert set(sources) == {"agent", "reference"}, sources
        # the agent labelled what the published tau rejected, the reference what it accepted
        assert sources["agent"]["score_min"] < sources["reference"]["score_min"]
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert main(["replay-online", *args, "--json", str(tmp_path / "again.json")]) == 0
    assert json.loads((tmp_path / "again.json").read_text())["tau_path"] == summary["tau_path"]
    # rolling risk control on the same stream: no warm-up to pay, so on 536 queries it
    # accepts more than the window can certify; its promise is the long-run average (here
    # target + (5 / 0.2) / (5 * 536) = 0.029 for the weighted loss), held to the tolerance
    rolled = tmp_path / "rolled.json"
    assert main(["replay-online", *args, "--rolling", "5", "--json", str(rolled)]) == 0
    assert "rolling risk control, step 5" in capsys.readouterr().out
    overall = json.loads(rolled.read_text())["overall"]
    assert overall["acceptance"] > summary["overall"]["acceptance"]
    assert overall["risk"] <= 1.5 * 0.02
    # a score-aware shadow policy; one policy at most
    by_score = [*args[:-6], "--max-risk", "0.02", "--shadow-margin", "1,0.3", "--shuffle", "3"]
    assert main(["replay-online", *by_score]) == 0
    assert "shadows MarginShadows(near=1.0, far=0.3, margin=1.5" in capsys.readouterr().out
    assert main(["replay-online", *by_score, "--shadow-rate", "0.2"]) == 2
    assert "one shadow policy at most" in capsys.readouterr().err


# --- rolling risk control (the long-run alternative) ------------------------------------------
ROLLING_STEP = 5.0
ROLLING_ACCEPTANCE = 0.55  # measured worst 0.70 (warm), 0.74 (cold) of hindsight, 10 seeds
ROLLING_RISK = 1.75  # measured worst 1.33x the target


def test_rolling_control_keeps_its_long_run_promise_on_adversarial_traffic():
    """Whatever the traffic, the average weighted loss is at most the target plus
    (start + step * max_loss) / (step * T) (gate/rolling.py): here drafts that always
    disagree once tau is permissive, and a change of traffic half way."""
    taus = default_taus()
    rng = np.random.default_rng(5)
    for step, chance in ((1.0, 1.0), (ROLLING_STEP, 0.3), (20.0, 0.3)):
        control = RollingControl(taus, TARGET, step, start=0.99)
        start = control.position
        n = 20_000
        for i in range(n):
            score = float(rng.uniform(0.9, 1.0))
            accepted = score > control.tau
            shadowed = accepted and rng.random() < chance
            # the first half disagrees below 0.99, the second everywhere it is accepted
            disagrees = score < 0.99 or i >= n // 2
            control.observe(str(i), accepted, disagrees if shadowed else None, chance)
        slack = (start + step / chance) / (step * n)
        assert control.average_loss() <= TARGET + slack, (step, control.average_loss())
        assert control.average_loss() >= TARGET - 0.01  # it does accept: no win by refusing


def test_rolling_control_counts_a_query_once_and_its_label_when_it_comes():
    control = RollingControl(default_taus(), TARGET, ROLLING_STEP, start=0.98)
    before = control.position
    control.observe("q", True, None, 0.5)  # accepted, its shadow under way
    assert control.queries == 1 and control.position == before + ROLLING_STEP * TARGET
    control.observe("q", True, True, 0.5)  # the shadow's label: it disagreed
    assert control.queries == 1 and control.losses == 2.0
    control.observe("q", True, True, 0.5)  # the run redelivered: nothing new
    control.observe("q", True, False, 0.5)
    assert control.queries == 1 and control.losses == 2.0
    assert control.position == pytest.approx(before + ROLLING_STEP * (TARGET - 2.0))


def test_the_gate_can_roll_instead_of_certifying():
    """RiskOptions(rolling_step=...): tau moves with each outcome from where the evidence put
    it, and the window's estimate is still reported beside it."""
    evidence = simulated_evidence(SCENARIOS["none"][0][0], 500, 7)
    window = OnlineGate(
        TARGET, evidence=evidence, labels=LabelOptions(seed=1), trust=TrustOptions(store=None)
    )
    gate = OnlineGate(
        TARGET,
        evidence=evidence,
        risk=RiskOptions(rolling_step=ROLLING_STEP),
        labels=LabelOptions(seed=1),
        trust=TrustOptions(store=None),
    )
    assert gate.tau == window.tau < 1.0
    for i in range(200):  # clean traffic: it grows more permissive, a candidate per 10 queries
        gate.observe(gate.decide(None), None, None, key=f"n{i}")
    assert gate.tau < window.tau
    assert gate.state()["rolling_loss"] == 0.0
    decision, position = gate.decide(1.0), gate.rolling.position
    assert decision.accepted
    gate.observe(replace(decision, shadowed=True, chance=0.5), 1.0, True, key="bad")
    # a wrong draft shadowed at chance 0.5 pulls it back step * (1 / 0.5 - target)
    assert gate.rolling.position == pytest.approx(position - ROLLING_STEP * (2 - TARGET))


@pytest.fixture(scope="module")
def rolled():
    out = {}
    for name, (segments, gradual) in SCENARIOS.items():
        stream = simulated_stream(segments, 101, gradual)
        gate = OnlineGate(
            TARGET,
            risk=RiskOptions(rolling_step=ROLLING_STEP),
            labels=LabelOptions(seed=101),
            trust=TrustOptions(store=None),
        )
        out[name] = summarise(stream, replay(stream, gate, seed=101), TARGET, default_taus(), 1000)
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rolling_figures_on_drifting_traffic(rolled, scenario):
    """Cold, at step 5: acceptance, risk and calls per workload within the measured figures'
    margins (docs/calibration.md: 10 seeds)."""
    for part in rolled[scenario]["segments"]:
        assert part["acceptance_ratio"] >= ROLLING_ACCEPTANCE, part
        assert part["risk"] <= ROLLING_RISK * TARGET, part
        assert part["agent_calls"] <= 1 - part["hindsight_acceptance"] + EXTRA_CALLS, part
