import math

import numpy as np
import pytest
import torch

from speceyes_graph.gate.separability import (
    GateConfig,
    SeparabilityError,
    acceptance_score,
    aggregate,
    answer_separability,
    answer_separability_from_logprobs,
    is_accepted,
    separability_of,
    softmax_confidence,
    softmax_confidence_from_logprobs,
    token_separability,
    token_separability_from_logprobs,
)
from speceyes_graph.models import fake_logprobs


def manual(row, k):
    top = sorted(row, reverse=True)[:k]
    comp = np.array(top[1:], dtype=np.float64)
    return (top[0] - comp.mean()) / (comp.std() + 1e-6)  # population std


def to_openai(logprob_rows, k):
    """OpenAI logprobs.content from full log-prob rows: the k largest, in vocab order (unsorted)."""
    content = []
    for row in logprob_rows:
        idx = np.argsort(-row)[:k]
        shuffled = np.random.default_rng(1).permutation(idx)
        top = [{"token": f"t{i}", "logprob": float(row[i])} for i in shuffled]
        content.append({"token": f"t{idx[0]}", "logprob": float(row[idx[0]]), "top_logprobs": top})
    return {"content": content}


def test_matches_published_formula_numpy_and_torch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 300)) * 3
    expected = [manual(r, 64) for r in logits]
    np.testing.assert_allclose(token_separability(logits, 64), expected, rtol=1e-10)
    np.testing.assert_allclose(token_separability(torch.tensor(logits), 64), expected, rtol=1e-5)
    assert answer_separability(logits, 64) == pytest.approx(min(expected))


def test_logprobs_give_the_same_score_as_logits():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(7, 1000)) * 4
    logprobs = torch.log_softmax(torch.tensor(logits), dim=-1).numpy()
    content = to_openai(logprobs, 64)
    np.testing.assert_allclose(
        token_separability_from_logprobs(content, 64), token_separability(logits, 64), rtol=1e-9
    )
    for agg in ("min", "mean", "bottom-q"):
        assert answer_separability_from_logprobs(content, 64, agg) == pytest.approx(
            answer_separability(logits, 64, agg)
        )
    # the bare list of entries works too, and so does a {token: logprob} mapping per token
    bare = content["content"]
    assert answer_separability_from_logprobs(bare, 64) == pytest.approx(
        answer_separability(logits, 64)
    )
    mapping = [
        {e["token"] + str(j): e["logprob"] for j, e in enumerate(entry["top_logprobs"])}
        for entry in bare
    ]
    assert answer_separability_from_logprobs(mapping, 64) == pytest.approx(
        answer_separability(logits, 64)
    )


def test_shift_and_scale_invariance():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 200))
    base = token_separability(logits, 64)
    np.testing.assert_allclose(token_separability(logits + 17.5, 64), base, rtol=1e-9)
    np.testing.assert_allclose(token_separability(logits * 0.25, 64), base, rtol=1e-4)


def test_aggregations():
    s = [5.0, 1.0, 3.0, 9.0, 2.0, 4.0, 8.0, 7.0, 6.0, 10.0]
    assert aggregate(s, "min") == 1.0
    assert aggregate(s, "mean") == 5.5
    assert aggregate(s, "bottom-q") == pytest.approx(1.5)  # the lowest 2 of 10
    assert aggregate([4.0, 2.0, 6.0], "bottom-q") == 2.0  # at least one token
    with pytest.raises(SeparabilityError, match="aggregation"):
        aggregate(s, "median")


def test_k_larger_than_available():
    logits = np.random.default_rng(3).normal(size=(2, 10))
    with pytest.raises(SeparabilityError, match="only 10"):
        token_separability(logits, 64)
    np.testing.assert_allclose(
        token_separability(logits, 64, clamp=True), [manual(r, 10) for r in logits]
    )
    short = fake_logprobs(["a", "b"], [8.0, 8.0], k=20)
    with pytest.raises(SeparabilityError, match="--max-logprobs 64"):
        answer_separability_from_logprobs(short, 64)
    assert answer_separability_from_logprobs(short, 64, clamp=True) == pytest.approx(8.0, rel=1e-6)


def test_empty_answer_is_an_error():
    with pytest.raises(SeparabilityError, match="empty"):
        answer_separability(np.zeros((0, 100)), 64)
    with pytest.raises(SeparabilityError, match="empty"):
        answer_separability(torch.zeros(0, 100), 64)
    with pytest.raises(SeparabilityError, match="empty"):
        answer_separability_from_logprobs({"content": []}, 64)
    with pytest.raises(SeparabilityError, match="empty"):
        GateConfig().evaluate({"content": []})


def test_ties():
    flat = np.zeros((1, 100))
    assert token_separability(flat, 64)[0] == 0.0  # top-1 no better than its competitors
    tied_top = np.zeros((1, 100))
    tied_top[0, :2] = 5.0  # top-1 tied with top-2: positive but small
    s = token_separability(tied_top, 64)[0]
    assert s == pytest.approx(manual(tied_top[0], 64))
    # a blind spot of the published score, kept exactly as published: it compares the top-1
    # with the *bulk* of the top-K, so a two-way tie far above the rest still passes the gate
    assert acceptance_score(s) > 0.98
    spread = np.linspace(4.0, -4.0, 100)[None, :]
    spread[0, 0] = spread[0, 1]  # tie at the top of a spread-out distribution: rejected
    assert acceptance_score(token_separability(spread, 64)[0]) < 0.98
    one_competitor_level = np.zeros((1, 100))
    one_competitor_level[0, 0] = 1.0  # competitors all equal: std 0, eps keeps it finite and huge
    assert token_separability(one_competitor_level, 64)[0] == pytest.approx(1e6)


def test_non_finite_inputs_are_errors_never_acceptances():
    bad = np.random.default_rng(4).normal(size=(2, 100))
    bad[1, 5] = np.nan
    with pytest.raises(SeparabilityError, match="NaN"):
        token_separability(bad, 64)
    with pytest.raises(SeparabilityError, match="NaN"):
        token_separability(torch.tensor(bad), 64)
    inf = np.random.default_rng(4).normal(size=(1, 100))
    inf[0, 0] = np.inf
    with pytest.raises(SeparabilityError, match="inf"):
        token_separability(inf, 64)
    masked = np.random.default_rng(4).normal(size=(1, 100))
    masked[0, 30:] = -np.inf  # only 30 finite logits, k=64 reaches into -inf
    with pytest.raises(SeparabilityError, match="inf"):
        token_separability(masked, 64)
    assert np.isfinite(token_separability(masked, 16)).all()  # fine when top-K is finite
    lp = fake_logprobs(["a"], [9.0])
    lp["content"][0]["top_logprobs"][3]["logprob"] = float("nan")
    with pytest.raises(SeparabilityError):
        GateConfig().evaluate(lp)
    with pytest.raises(SeparabilityError):
        acceptance_score(float("nan"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    logits = torch.randn(4, 512, generator=torch.Generator().manual_seed(5)) * 5
    ref = token_separability(logits.to(dtype).float(), 64)
    got = token_separability(logits.to(dtype), 64)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(got, token_separability(logits, 64), rtol=0.05)


def test_acceptance_is_strictly_above_tau():
    assert acceptance_score(0.0) == 0.5
    assert acceptance_score(10.0, alpha=0.6) == pytest.approx(1 / (1 + math.exp(-6)))
    assert acceptance_score(-1e6) == 0.0 and acceptance_score(1e6) == 1.0  # no overflow
    score = acceptance_score(7.0)
    assert not is_accepted(score, tau=score)
    assert is_accepted(score, tau=score - 1e-12)
    raw_at_tau = math.log(0.98 / 0.02) / 0.6
    assert not is_accepted(acceptance_score(raw_at_tau - 1e-6), 0.98)
    assert is_accepted(acceptance_score(raw_at_tau + 1e-6), 0.98)


def test_softmax_baseline_from_logits_and_logprobs():
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(6)) * 3
    expected = float(torch.exp(torch.log_softmax(logits, -1).max(-1).values.double().mean()))
    assert softmax_confidence(logits) == pytest.approx(expected, rel=1e-5)
    assert softmax_confidence(logits.numpy()) == pytest.approx(expected, rel=1e-5)
    content = to_openai(torch.log_softmax(logits.double(), -1).numpy(), 64)
    assert softmax_confidence_from_logprobs(content) == pytest.approx(expected, rel=1e-5)


def test_gate_config_evaluates_drafts():
    lp = fake_logprobs(["Paris", "."], [9.0, 7.0])
    out = GateConfig().evaluate(lp)
    assert out["tokens"] == ["Paris", "."]
    np.testing.assert_allclose(out["token_scores"], [9.0, 7.0], rtol=1e-6)
    assert out["separability"] == pytest.approx(7.0, rel=1e-6)
    assert out["score"] == pytest.approx(acceptance_score(7.0))
    assert out["accepted"] is True
    assert len(out["top_logprobs"][0]) == 64 and out["top_logprobs"][0] == sorted(
        out["top_logprobs"][0], reverse=True
    )
    assert GateConfig(aggregation="mean").evaluate(lp)["separability"] == pytest.approx(
        8.0, rel=1e-6
    )
    low = GateConfig().evaluate(fake_logprobs(["x"], [4.0]))
    assert low["accepted"] is False
    soft = GateConfig(score="softmax", tau=0.5).evaluate(lp)
    assert soft["score"] == pytest.approx(soft["softmax_confidence"])
    with pytest.raises(ValueError):
        GateConfig(aggregation="max")


def _entry(token, values):
    return {
        "token": token,
        "logprob": values[0],
        "top_logprobs": [{"token": token, "logprob": v} for v in values],
    }


def test_a_trailing_end_of_turn_token_is_not_scored():
    """vLLM and SGLang return the end-of-turn token as the last log-prob entry; the gate
    scores the answer's own tokens, as the published evaluation and the transformers path."""
    rng = np.random.default_rng(0)
    answer = [_entry(t, sorted(rng.normal(size=64), reverse=True)) for t in ("bl", "ue")]
    unsure_end = _entry("<|im_end|>", [0.0] * 2 + [-0.001] * 62)  # would reject the draft
    gate = GateConfig(tau=0.5)
    alone = gate.evaluate({"content": answer})
    served = gate.evaluate({"content": [*answer, unsure_end]})
    assert served["tokens"] == alone["tokens"] == ["bl", "ue"]
    assert served["token_scores"] == alone["token_scores"]
    assert served["separability"] == alone["separability"]
    assert len(token_separability_from_logprobs([*answer, unsure_end])) == 2
    # only at the end: an end token inside the content is the model's business, scored
    assert len(gate.evaluate({"content": [answer[0], unsure_end, answer[1]]})["tokens"]) == 3
    with pytest.raises(SeparabilityError, match="empty answer"):  # nothing but the end
        gate.evaluate({"content": [unsure_end]})


def test_separability_of_inverts_the_acceptance_score():
    """Taus and stored scores live on the acceptance scale; separability_of takes them back
    (the published 0.98 is separability 6.49 at alpha 0.6), at any alpha, and stays finite
    at the scale's ends."""
    for raw in (-12.0, -1.0, 0.0, 2.5, 6.49, 11.0):
        for alpha in (0.6, 1.0):
            assert separability_of(acceptance_score(raw, alpha), alpha) == pytest.approx(raw)
    assert separability_of(0.98) == pytest.approx(6.486, abs=1e-3)
    assert np.isfinite(separability_of(1.0)) and np.isfinite(separability_of(0.0))
    assert separability_of(0.0) < 0 < separability_of(1.0)
