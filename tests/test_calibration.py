"""The calibrated gate: exact p-values, a guarantee that holds in simulation, a gate file the
graph and the benchmark CLI accept."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import GateConfig, create_speceyes_graph
from speceyes_graph.gate.calibration import binomial_tail_pvalue, calibrate

COMPETITORS = np.sort(np.random.default_rng(0).normal(0, 1, 63))[::-1]


def record(i, separability, draft_right, agent_right=True):
    top1 = COMPETITORS.mean() + separability * (COMPETITORS.std() + 1e-6)
    row = [float(top1), *map(float, COMPETITORS)]
    return (
        {
            "id": f"q{i}",
            "draft": {"text": "A", "top_logprobs": [row]},
            "draft_correct": bool(draft_right),
        },
        {"id": f"q{i}", "correct": bool(agent_right)},
    )


def test_binomial_tail_is_exact():
    for n, k, p in [(10, 3, 0.2), (50, 0, 0.05), (200, 7, 0.03), (30, 30, 0.5)]:
        direct = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1))
        assert binomial_tail_pvalue(k, n, p) == pytest.approx(direct, rel=1e-9)


def true_risk(s_star, top=12.0):
    """risk when drafts with separability > s_star are accepted; S ~ U(0, top),
    P(draft right | S) = sigmoid(S - 6), agent right w.p. 0.9 independently."""
    a = min(max(s_star, 0.0), top)
    integral = (top - a) - (math.log1p(math.exp(top - 6)) - math.log1p(math.exp(a - 6)))
    return 0.9 * integral / top


def simulate(rng, n):
    s = rng.uniform(0, 12, n)
    right = rng.random(n) < 1 / (1 + np.exp(-(s - 6)))
    agent = rng.random(n) < 0.9
    pairs = [record(i, s[i], right[i], agent[i]) for i in range(n)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


TAUS = [1 / (1 + math.exp(-0.6 * s)) for s in np.linspace(12, 0, 61)]  # a grid in separability


def separability_at(tau):
    """The separability a gate score tau stands for (99: accept nothing)."""
    return math.log(tau / (1 - tau)) / 0.6 if tau < 1 else 99


def assert_rate_within(violations, trials, delta):
    """The share of trials whose true risk passed eps is at most delta (3 standard errors)."""
    rate = violations / trials
    assert rate <= delta + 3 * math.sqrt(delta * (1 - delta) / trials), rate


def test_the_guarantee_holds_in_simulation():
    eps, delta, trials, n = 0.03, 0.1, 300, 300
    rng = np.random.default_rng(42)
    violations, accepted = 0, []
    for _ in range(trials):
        records, baseline = simulate(rng, n)
        result = calibrate(records, max_drop=eps, delta=delta, baseline=baseline, taus=TAUS)
        violations += true_risk(separability_at(result.tau)) > eps
        accepted.append(result.calibration["accepted"])
    assert_rate_within(violations, trials, delta)
    assert np.mean(accepted) > 0.2  # and it is not vacuous: it does accept drafts


def test_no_certifiable_tau_accepts_nothing():
    pairs = [record(i, 9.0, draft_right=False) for i in range(50)]  # confident and always wrong
    result = calibrate(
        [p[0] for p in pairs], max_drop=0.01, delta=0.1, baseline=[p[1] for p in pairs]
    )
    assert result.tau == 1.0 and result.calibration["accepted"] == 0.0


def test_gate_file_drives_the_graph(tmp_path, scene):
    rng = np.random.default_rng(1)
    records, baseline = simulate(rng, 400)
    result = calibrate(records, max_drop=0.05, delta=0.1, baseline=baseline, holdout=0.3)
    assert result.holdout["n"] > 50 and 0 <= result.holdout["risk"] <= 1
    path = tmp_path / "gate.json"
    result.save(path)
    gate = GateConfig.load(path)
    assert gate.tau == result.tau and gate.k == 64 and gate.aggregation == "min"
    just_below = math.log(result.tau / (1 - result.tau)) / 0.6 - 0.05
    g = create_speceyes_graph(
        judge=judge("no"),
        speculator=speculator("A", just_below),
        agent=deepeyes_agent(),
        gate=str(path),
    ).compile()
    assert g.invoke({"question": "q", "images": [scene]})["route"] == "rejected-agentic"


def test_calibrate_command(tmp_path):
    rng = np.random.default_rng(2)
    records, baseline = simulate(rng, 300)
    for folder, rows in (("run", records), ("base", baseline)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "records.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    r = subprocess.run(
        [sys.executable, "-m", "speceyes_graph.cli", "calibrate", str(tmp_path / "run"),
         "--baseline", str(tmp_path / "base"), "--max-drop", "0.05", "--delta", "0.1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "with probability >= 0.9" in r.stdout and "held out" in r.stdout
    gate = json.loads((tmp_path / "run" / "gate.json").read_text())["gate"]
    assert 0.5 < gate["tau"] < 1 and gate["method"].startswith("Learn-then-Test")
    # the calibration queries, labelled, kept for an online gate to start from
    assert len(gate["evidence"]) == gate["n_calibration"] and {
        type(loss) for _, loss in gate["evidence"]
    } == {bool}
    from speceyes_graph.gate.online import OnlineGate, TrustOptions

    online = OnlineGate(0.05, config=tmp_path / "run" / "gate.json", trust=TrustOptions(store=None))
    assert online.state()["seeded"] == gate["n_calibration"] and online.tau < 1.0
    # seeded where the calibration drafts scored, with their losses (calibrate once kept
    # acceptance scores, which the gate squashed through the sigmoid again, all below 0.65:
    # every tau above looked risk-free)
    from collections import Counter

    from speceyes_graph.gate.calibration import draft_scores

    agent_right = {r["id"]: r["correct"] for r in baseline}
    drafts = Counter(
        (round(draft_scores(r, "min", 64), 9), agent_right[r["id"]] and not r["draft_correct"])
        for r in records
    )
    seeds = Counter((round(q.score, 9), q.disagrees) for q in online.seeds)
    assert seeds.total() == gate["n_calibration"] and not seeds - drafts
    assert sum(y for (score, y), n in seeds.items() if score > 0.9) > 0  # losses up there


def with_tool_drafts(records, rng):
    """The same records, some of them tool-needing: their draft moves to ``tool_draft``."""
    out = []
    for r in records:
        if rng.random() < 0.5:
            r = {
                **r,
                "draft": None,
                "draft_correct": False,
                "tool_draft": r["draft"],
                "tool_draft_correct": r["draft_correct"],
            }
        out.append(r)
    return out


def test_tau_depth_has_the_same_guarantee_in_simulation():
    """tau_depth is certified on the tool drafts alone: its loss stays under eps w.p. 1-delta."""
    eps, delta, trials, n = 0.03, 0.1, 150, 400
    rng = np.random.default_rng(7)
    violations, accepted = 0, []
    for _ in range(trials):
        records, baseline = simulate(rng, n)
        records = with_tool_drafts(records, rng)
        result = calibrate(records, max_drop=eps, delta=delta, baseline=baseline, taus=TAUS)
        assert result.tau_depth is not None
        # half the queries carry a tool draft
        violations += 0.5 * true_risk(separability_at(result.tau_depth)) > eps
        accepted.append(result.depth_calibration["accepted"])
    assert_rate_within(violations, trials, delta)
    assert np.mean(accepted) > 0.1


def test_tau_depth_reaches_the_gate_file_and_the_graph(tmp_path):
    rng = np.random.default_rng(3)
    records, baseline = simulate(rng, 400)
    result = calibrate(with_tool_drafts(records, rng), max_drop=0.05, delta=0.1, baseline=baseline)
    path = tmp_path / "gate.json"
    result.save(path)
    gate = GateConfig.load(path)
    assert gate.tau_depth == result.tau_depth and gate.after_tools().tau == result.tau_depth
    assert gate.tau == result.tau
    # without tool drafts there is no tau_depth (the graph then uses tau)
    plain = calibrate(records, max_drop=0.05, delta=0.1, baseline=baseline)
    assert plain.tau_depth is None
