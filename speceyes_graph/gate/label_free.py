"""A threshold without labels: tau from the shape of the drafts' separability distribution.

``speceyes calibrate`` certifies tau from a labelled run. A user moving to a new domain has
unlabelled traffic and the small model's drafts, nothing more. The paper observes that answer
separability is bimodal over right and wrong drafts; when it is, the two modes can be found
without labels and the gate put between them.

**The model.** A two-component Gaussian mixture, fitted by EM, on the *separability scale*:
the aggregated per-draft score ``S`` (``min`` over the answer's tokens by default) before the
published ``sigmoid(0.6 * S)``. Why that scale: the sigmoid saturates, so every confident
draft piles up against 1.0 and the upper mode becomes a spike no Gaussian describes, while on
``S`` itself each mode is a hump. Why Gaussian: two means, two spreads and a weight are all
the data of a few hundred drafts can pin down, and a 1-D Gaussian mixture has a likelihood
to compare against one Gaussian (BIC). The upper component is taken to be the right drafts.

**tau** follows one of three rules (``rule=``, or implied by the one parameter given):

- ``"min_accuracy"``, the default, at level :data:`DEFAULT_MIN_ACCURACY` (0.99): the lowest
  tau at which the mixture's estimate of the accepted drafts' accuracy, the mean of
  P(upper | S) over the drafts with S > tau, is at least the level, there and at every higher
  candidate. Candidates are the midpoints between consecutive distinct scores (a tau is never
  a draft's own score) and one unit below the lowest; the scan runs from the highest down and
  stops at the first that falls short, so tau cannot sit in a dip of the estimate that this
  sample's draws put there. When not even the strictest reaches the level it refuses
  (:class:`LevelNotReached`, naming the level and the best estimate).
- ``"crossing"`` (``posterior=P``): where P(upper | S) = P between the two means; P = 1/2 is
  where the components' posteriors cross.
- ``"target_acceptance"``: the score above which that share of the drafts lies.

tau is mapped back to the acceptance scale and written as the same gate file the labelled
calibration writes; its ``method`` names the rule and its parameter.

**Why the accuracy rule is the default.** The crossing puts the fewest drafts on the wrong
side: it weighs a wrong draft let through the same as a right draft sent to the agent. A
speculative gate is for the opposite trade, few wrong drafts through at some cost in drafts
accepted, and on real outputs of the official SpecEyes scripts the crossing's accepted
drafts were right less often than the published tau's (docs/calibration.md has the replay).
The accuracy rule asks for the quantity a user cares about, in its own units.

**What the estimate rests on**: that the upper component is the right drafts, and that each
mode is Gaussian on the separability scale. Simulation (``tests/test_label_free.py``: 300
drafts a run, 400 runs a shape, an unsure mode near 5 and a confident one near 8-10, 30-40%
unsure, truth = the component that drew the draft): with Gaussian modes the accepted drafts'
true accuracy is on average within 0.6 points of the level (2.2 where the modes overlap near
the refusal criterion's edge), the spread of a 300-draft fit puts one run in twenty 3-8
points below it at 0.99, and the worst single runs 8-20 points below. A right-skewed unsure
mode (gamma, skew-normal) reaches into the confident range with a tail its Gaussian fit
misses, and the estimate is optimistic by 5-7 points on average (under one point when a
long left tail of the confident mode meets it). The table is in ``docs/calibration.md``.

**Why 0.99.** Of the levels 0.9, 0.95, 0.97, 0.98 and 0.99 it is the lowest at which, in
those simulations, the accepted drafts are on average at least as accurate as the crossing's
on every shape (at 0.98 three shapes fall below it, the gamma-shaped unsure mode most:
0.926 against 0.931) and, on every Gaussian shape, at least as accurate as the published tau's were on
real drafts (0.972-0.987 against 0.963). It costs 1-5 points of drafts accepted against the
crossing where the modes are apart (0.60-0.68 against 0.62-0.69), more where they overlap
(0.41 against 0.62, and a refusal in one run in eight). A lower level is a decision to take
with a labelled sample in hand.

**When it refuses** (:class:`NotBimodal`). All of these must hold, else there is no second
mode to place a threshold against and a labelled calibration is the only honest option:

- at least :data:`MIN_DRAFTS` drafts with log-probs;
- two components explain the scores much better than one: BIC(1) - BIC(2) >= :data:`MIN_DELTA_BIC`
  (10: "very strong" evidence on Kass and Raftery's scale);
- the components are separated: Ashman's D = sqrt(2) |m1 - m2| / sqrt(s1^2 + s2^2) >=
  :data:`MIN_ASHMAN_D` (2: below it two Gaussians overlap into one hump);
- neither component is a handful of outliers: both weights >= :data:`MIN_WEIGHT`;
- the lower mode is unsure: its mean lies below the published tau (0.98) on the separability
  scale (6.49). When both modes are confident, they are two kinds of queries (the demo's
  tool-free drafts are all right and still bimodal, by question), not right and wrong drafts;
- for the crossing, the posteriors cross at P between the two means; for the accuracy rule,
  some threshold reaches the level under the fit.

What it cannot know: whether the upper mode *is* the right drafts. A model confidently wrong
on a whole class of queries puts them in the upper mode and the gate accepts them. The
calibration's dictionary carries the mixture's own estimate of the accepted drafts'
accuracy (the mean posterior of the upper component among them), which is only as good as
that assumption, and, where the records carry labels (``draft_correct``), what the labels
say of the same drafts: labels check the estimate, they never choose tau.
``docs/calibration.md`` says when to trust it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from .calibration import Calibration, draft_token_depth, raw_draft_score
from .drift import ScoreDistribution
from .separability import (
    DEFAULT_ALPHA,
    DEFAULT_TAU,
    Aggregation,
    acceptance_score,
    separability_of,
)

__all__ = [
    "DEFAULT_MIN_ACCURACY",
    "RULES",
    "Bimodality",
    "LevelNotReached",
    "Mixture",
    "NotBimodal",
    "Rule",
    "bimodality",
    "calibrate_unlabelled",
    "describe_rule",
    "fit_mixture",
    "label_free_tau",
    "min_accuracy_tau",
    "modelled_accuracy_curve",
]

MIN_DRAFTS = 30
MIN_DELTA_BIC = 10.0
MIN_ASHMAN_D = 2.0
MIN_WEIGHT = 0.05
# the published tau on the separability scale: a lower mode above it is not "unsure drafts"
UNSURE_BELOW = separability_of(DEFAULT_TAU)
# the default level of the min_accuracy rule: why this value, in the module docstring
DEFAULT_MIN_ACCURACY = 0.99

Rule = Literal["min_accuracy", "crossing", "target_acceptance"]
RULES: tuple[Rule, ...] = ("min_accuracy", "crossing", "target_acceptance")
# each rule's parameter, by its keyword
_PARAMETER: dict[str, str] = {
    "min_accuracy": "min_accuracy",
    "crossing": "posterior",
    "target_acceptance": "target_acceptance",
}


class NotBimodal(ValueError):
    """The drafts' scores show no second mode: a label-free tau would be a guess."""


class LevelNotReached(NotBimodal):
    """The drafts are bimodal, but under the fit no threshold's accepted drafts reach the
    accuracy level asked. A :class:`NotBimodal` so that every caller that handles a refusal
    handles this one: either way there is no label-free tau to give."""

    def __init__(self, message: str, level: float = math.nan, best: float = math.nan) -> None:
        super().__init__(message)  # defaults: an unpickled copy is rebuilt from the message
        self.level, self.best = level, best


@dataclass(frozen=True)
class Mixture:
    """Two Gaussians on the separability scale, the lower one first."""

    weights: tuple[float, float]
    means: tuple[float, float]
    sds: tuple[float, float]
    log_likelihood: float
    n: int

    def posterior_upper(self, x: Sequence[float] | np.ndarray) -> np.ndarray:
        """P(upper component | S) for each score."""
        lj = _log_joint(np.asarray(x, dtype=float).reshape(-1), self.weights, self.means, self.sds)
        return 1.0 / (1.0 + np.exp(np.clip(lj[0] - lj[1], -700, 700)))

    def crossing(self, posterior: float = 0.5) -> float | None:
        """The score between the two means where P(upper | S) = ``posterior`` (None: none)."""
        lo, hi = self.means
        f = lambda x: float(self.posterior_upper([x])[0]) - posterior  # noqa: E731
        if not f(lo) < 0 < f(hi):
            return None
        for _ in range(100):  # bisection: the posterior may not be monotone outside the means
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2


def _log_joint(x: np.ndarray, w, m, s) -> np.ndarray:
    """log(w_k N(x; m_k, s_k)) without the 2 pi term, shape (2, len(x))."""
    w, m, s = (np.asarray(v, dtype=float)[:, None] for v in (w, m, s))
    return np.log(w) - np.log(s) - 0.5 * ((x - m) / s) ** 2


def _pair(v: np.ndarray) -> tuple[float, float]:
    """The two components' values (lower first) as floats."""
    return float(v[0]), float(v[1])


def _normal_log_likelihood(x: np.ndarray) -> float:
    sd = max(float(x.std()), 1e-9)
    return float(
        np.sum(-np.log(sd) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - x.mean()) / sd) ** 2)
    )


def fit_mixture(scores: Sequence[float] | np.ndarray, max_iter: int = 500) -> Mixture:
    """Maximum-likelihood two-component fit by EM, from three splits of the sorted scores
    (at the quartiles and the median); the best likelihood wins, so the result is
    deterministic. Each spread is floored at 1% of the scores' spread: a component that
    collapses onto a few identical scores would otherwise have an unbounded likelihood."""
    x = np.sort(np.asarray(scores, dtype=float).reshape(-1))
    if len(x) < 4 or not np.isfinite(x).all():
        raise ValueError("a mixture needs at least 4 finite scores")
    floor = max(0.01 * float(x.std()), 1e-9)
    best: Mixture | None = None
    for split in (0.25, 0.5, 0.75):
        cut = max(1, min(len(x) - 1, int(round(split * len(x)))))
        parts = (x[:cut], x[cut:])
        w = np.array([len(p) / len(x) for p in parts])
        m = np.array([p.mean() for p in parts])
        s = np.array([max(float(p.std()), floor) for p in parts])
        previous = -math.inf
        for _ in range(max_iter):  # E-step: responsibilities; M-step: weighted moments
            lj = _log_joint(x, w, m, s)
            per_score = np.logaddexp(lj[0], lj[1])
            ll = float(per_score.sum()) - 0.5 * len(x) * math.log(2 * math.pi)
            r = np.exp(lj - per_score)
            nk = r.sum(axis=1) + 1e-12
            w = np.clip(nk / len(x), 1e-6, 1.0)
            m = (r @ x) / nk
            s = np.maximum(np.sqrt((r * (x - m[:, None]) ** 2).sum(axis=1) / nk), floor)
            if ll - previous < 1e-9 * max(1.0, abs(ll)):
                break
            previous = ll
        order = np.argsort(m)
        fit = Mixture(_pair(w[order] / w.sum()), _pair(m[order]), _pair(s[order]), ll, len(x))
        if best is None or fit.log_likelihood > best.log_likelihood:
            best = fit
    assert best is not None
    return best


@dataclass(frozen=True)
class Bimodality:
    """The refusal criterion's figures (see the module docstring) and what failed."""

    n: int
    delta_bic: float
    ashman_d: float
    min_weight: float
    failures: tuple[str, ...]

    @property
    def bimodal(self) -> bool:
        return not self.failures


def bimodality(scores: np.ndarray, mixture: Mixture) -> Bimodality:
    n = len(scores)
    bic1 = -2 * _normal_log_likelihood(scores) + 2 * math.log(n)
    bic2 = -2 * mixture.log_likelihood + 5 * math.log(n)
    (m1, m2), (s1, s2) = mixture.means, mixture.sds
    d = math.sqrt(2) * abs(m2 - m1) / math.sqrt(s1**2 + s2**2)
    failures = []
    if n < MIN_DRAFTS:
        failures.append(f"{n} drafts with log-probs (at least {MIN_DRAFTS} needed)")
    if bic1 - bic2 < MIN_DELTA_BIC:
        failures.append(
            f"two components barely beat one (BIC gain {bic1 - bic2:.1f} < {MIN_DELTA_BIC:g})"
        )
    if d < MIN_ASHMAN_D:
        failures.append(f"the components overlap (Ashman's D {d:.2f} < {MIN_ASHMAN_D:g})")
    if min(mixture.weights) < MIN_WEIGHT:
        failures.append(
            f"one component holds {min(mixture.weights):.1%} of the drafts (< {MIN_WEIGHT:.0%})"
        )
    if m1 >= UNSURE_BELOW:
        failures.append(
            f"both modes are confident (the lower one at separability {m1:.2f}, above the "
            f"published tau's {UNSURE_BELOW:.2f}): they are likely two kinds of queries, "
            "not right and wrong drafts"
        )
    return Bimodality(n, bic1 - bic2, d, min(mixture.weights), tuple(failures))


def _resolve_rule(
    rule: Rule | None,
    min_accuracy: float | None,
    posterior: float | None,
    target_acceptance: float | None,
) -> tuple[Rule, float]:
    """(the rule, its parameter) from what the caller named; a ValueError when they name two
    rules, a rule with another's parameter, or a parameter outside (0, 1). Naming only
    ``posterior`` selects the crossing and only ``target_acceptance`` the acceptance rule, as
    they did before the accuracy rule became the default."""
    named: tuple[tuple[Rule, float | None], ...] = (
        ("min_accuracy", min_accuracy),
        ("crossing", posterior),
        ("target_acceptance", target_acceptance),
    )
    given: dict[Rule, float] = {name: value for name, value in named if value is not None}
    words = lambda names: " and ".join(_PARAMETER[n] for n in names)  # noqa: E731
    if rule is None:
        if len(given) > 1:
            raise ValueError(f"choose one rule, not {words(given)}")
        rule = next(iter(given)) if given else "min_accuracy"
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
    others = [n for n in given if n != rule]
    if others:
        raise ValueError(f"rule {rule!r} takes no {words(others)}")
    default = {"min_accuracy": DEFAULT_MIN_ACCURACY, "crossing": 0.5}.get(rule)
    value = given.get(rule, default)
    if value is None:
        raise ValueError(f"rule {rule!r} needs {_PARAMETER[rule]}")
    if not 0 < value < 1:
        raise ValueError(f"{_PARAMETER[rule]} must be in (0, 1), not {value:g}")
    return rule, float(value)


def modelled_accuracy_curve(
    scores: Sequence[float] | np.ndarray, mixture: Mixture
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate threshold, highest first, with the mixture's estimate of the accuracy
    of the drafts above it (the mean of P(upper | S) over them) and how many those are.

    Candidates are the midpoints between consecutive distinct scores, so a threshold never
    equals a draft's score (the gate's strict ``>`` and this count cannot disagree), and one
    separability unit below the lowest score (accept everything)."""
    x = np.sort(np.asarray(scores, dtype=float).reshape(-1))[::-1]
    if len(x) == 0:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=int)
    running = np.cumsum(mixture.posterior_upper(x)) / np.arange(1, len(x) + 1)
    last = np.flatnonzero(np.r_[x[1:] < x[:-1], True])  # the last draft of each distinct score
    below = np.r_[(x[last[:-1]] + x[last[:-1] + 1]) / 2, x[-1] - 1.0]
    return below, running[last], last + 1


def min_accuracy_tau(
    scores: Sequence[float] | np.ndarray, mixture: Mixture, level: float
) -> tuple[float | None, float]:
    """(tau, the estimate there): the lowest candidate (see :func:`modelled_accuracy_curve`)
    whose accepted drafts' modelled accuracy is at least ``level`` there and at every higher
    candidate; (None, the best estimate of any candidate) when not even the strictest one
    reaches it.

    The scan runs from the highest candidate down and stops at the first that falls short:
    the estimate is not monotone in tau (a wide lower component's Gaussian tail claims a
    share of the very highest scores), and a tau below a failure would sit in a dip that
    only this sample's draws put there."""
    candidates, estimates, _ = modelled_accuracy_curve(scores, mixture)
    if len(candidates) == 0:
        return None, math.nan
    short = np.flatnonzero(estimates < level)
    passing = int(short[0]) if len(short) else len(estimates)
    if passing == 0:
        return None, float(estimates.max())
    return float(candidates[passing - 1]), float(estimates[passing - 1])


def label_free_tau(
    scores: Sequence[float] | np.ndarray,
    *,
    min_accuracy: float | None = None,
    posterior: float | None = None,
    target_acceptance: float | None = None,
    rule: Rule | None = None,
) -> tuple[float, Mixture, Bimodality]:
    """(tau on the separability scale, the fit, the criterion), or :class:`NotBimodal`.

    The rule (module docstring): ``min_accuracy`` (default, level
    :data:`DEFAULT_MIN_ACCURACY`) unless ``rule`` says otherwise, or the only parameter given
    is ``posterior`` (the crossing) or ``target_acceptance``; naming two is a ValueError."""
    rule, value = _resolve_rule(rule, min_accuracy, posterior, target_acceptance)
    x = np.asarray([s for s in scores if s is not None and math.isfinite(s)], dtype=float)
    if len(x) < 4:
        raise NotBimodal(
            f"only {len(x)} drafts with log-probs: no distribution to read a threshold from; "
            "calibrate with labels (speceyes calibrate RUN --max-drop EPS --baseline AGENT_RUN)"
        )
    mixture = fit_mixture(x)
    check = bimodality(x, mixture)
    failures = list(check.failures)
    tau = None
    if rule == "target_acceptance":
        tau = float(np.quantile(x, 1 - value))
    elif not failures and rule == "crossing":
        tau = mixture.crossing(value)
        if tau is None:
            failures.append(f"the posteriors never reach {value:g} between the two means")
    if failures:
        raise NotBimodal(
            "no label-free tau: the drafts' separability has no clear mode of unsure drafts ("
            + "; ".join(failures)
            + ")"
            + ". A threshold would be a guess here; calibrate with labels instead "
            "(speceyes calibrate RUN --max-drop EPS --baseline AGENT_RUN)"
        )
    if rule == "min_accuracy":
        tau, best = min_accuracy_tau(x, mixture, value)
        if tau is None:
            raise LevelNotReached(
                f"no label-free tau at accuracy {value:g}: no threshold's accepted drafts reach "
                f"it under the fit, the best estimate is {best:.4f} (under the fit even the "
                "highest-scoring drafts are unsure ones with some probability). Ask for a lower "
                "level (min_accuracy, --min-accuracy) knowing the estimate is only as good as "
                "the fit, or calibrate with labels "
                "(speceyes calibrate RUN --max-drop EPS --baseline AGENT_RUN)",
                level=value,
                best=best,
            )
    assert tau is not None
    return tau, mixture, check


def _labelled(flags: Sequence[object]) -> tuple[float | None, int]:
    """(share of True among the bool labels, how many are bools): None marks unknown."""
    known = [bool(f) for f in flags if isinstance(f, (bool, np.bool_))]
    return (float(np.mean(known)) if known else None), len(known)


def _stage(
    records: Sequence[dict],
    key: str,
    aggregation: Aggregation,
    k: int,
    rule: Rule,
    value: float,
    alpha: float,
) -> tuple[float, dict[str, Any], dict[str, Any], ScoreDistribution]:
    """One kind of draft (``key``: the draft, or the tool draft of depth-D speculation): tau on
    the acceptance scale, the summary the gate file keeps, the fit and the criterion, and the
    calibration distribution drift checks compare against."""
    scored = [(r, raw_draft_score(r, aggregation, k, key)) for r in records]
    pairs = [(r, s) for r, s in scored if s is not None]
    raw = [s for _, s in pairs]
    tau_raw, mixture, check = label_free_tau(raw, rule=rule, **{_PARAMETER[rule]: value})
    tau = acceptance_score(tau_raw, alpha)
    x = np.asarray(raw)
    accepted = np.asarray([acceptance_score(s, alpha) > tau for s in x])  # the gate's own test
    # labels never choose tau; where the records carry them they check the estimate
    label_accuracy, labelled = _labelled(
        [r.get(f"{key}_correct") for (r, _), a in zip(pairs, accepted, strict=True) if a]
    )
    summary = {
        "n_drafts": len(x),
        "rule": rule,
        _PARAMETER[rule]: value,
        "accepted_of_drafts": float(accepted.mean()),
        "tau_separability": tau_raw,
        # the mixture's own estimate, valid only if the upper mode is the right drafts
        "modelled_accuracy_of_accepted": (
            float(mixture.posterior_upper(x[accepted]).mean()) if accepted.any() else None
        ),
        "n_accepted": int(accepted.sum()),
        "labelled_of_accepted": labelled,
        "labelled_accuracy_of_accepted": label_accuracy,
    }
    fit = {**asdict(mixture), **asdict(check), "bimodal": check.bimodal}
    return tau, summary, fit, ScoreDistribution.from_scores(raw, tau, alpha)


def describe_rule(rule: Rule, value: float) -> str:
    """The rule in words, as the gate file's ``method`` records it."""
    if rule == "min_accuracy":
        return (
            f"rule min_accuracy {value:g}: the lowest tau whose accepted drafts' modelled "
            f"accuracy is >= {value:g}"
        )
    if rule == "crossing":
        return f"rule crossing: tau where P(upper component) = {value:g}"
    return f"rule target_acceptance: tau at {value:.0%} acceptance"


def calibrate_unlabelled(
    records: Sequence[dict],
    *,
    aggregation: Aggregation = "min",
    k: int | None = None,
    min_accuracy: float | None = None,
    posterior: float | None = None,
    target_acceptance: float | None = None,
    rule: Rule | None = None,
) -> Calibration:
    """A gate from unlabelled drafts (see the module docstring); raises :class:`NotBimodal`
    (:class:`LevelNotReached` when the drafts are bimodal but no tau reaches the level).

    The rule is chosen as in :func:`label_free_tau`: by default the lowest tau whose accepted
    drafts' modelled accuracy is at least ``min_accuracy`` (default
    :data:`DEFAULT_MIN_ACCURACY`); ``posterior=P`` or ``rule="crossing"`` puts tau where the
    posteriors cross, ``target_acceptance`` at a share of drafts accepted. The ``method``
    string names the rule and its parameter. Records that carry ``draft_correct`` (a bool;
    None is unknown) get the accepted drafts' labelled accuracy in ``calibration``, beside the
    estimate: labels check the estimate, they never choose tau.

    With tool drafts (depth-D speculation) their ``tau_depth`` is fitted the same way; when
    they are not bimodal it is 1.0 (no answer after tool steps accepted) and the reason is
    kept in ``depth_mixture["refused"]``: a depth gate nobody can justify stays shut."""
    chosen, value = _resolve_rule(rule, min_accuracy, posterior, target_acceptance)
    depth = draft_token_depth(records)
    k = min(k or depth, depth)
    tau, summary, fit, distribution = _stage(
        records, "draft", aggregation, k, chosen, value, DEFAULT_ALPHA
    )
    result = Calibration(
        tau=float(tau),
        aggregation=aggregation,
        k=int(k),
        max_drop=None,
        delta=None,
        n_calibration=len(records),
        method="two-component Gaussian mixture on the separability scale, "
        + describe_rule(chosen, value),
        loss="none: no labels (no guarantee)",
        calibration=summary,
        mixture=fit,
        distribution=distribution.to_dict(),
    )
    if any(r.get("tool_draft") for r in records):
        try:
            tau_d, summary_d, fit_d, dist_d = _stage(
                records, "tool_draft", aggregation, k, chosen, value, DEFAULT_ALPHA
            )
        except NotBimodal as exc:
            result.tau_depth, result.depth_mixture = 1.0, {"refused": str(exc)}
        else:
            result.tau_depth = float(tau_d)
            result.depth_calibration, result.depth_mixture = summary_d, fit_d
            result.depth_distribution = dist_d.to_dict()
    return result
