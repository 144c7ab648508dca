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

**tau** is where the components' posteriors cross, P(upper | S) = 1/2 between the two means
(``posterior=P`` moves the crossing to P(upper | S) = P: stricter for P > 1/2), or the
score above which a chosen share of drafts lies (``target_acceptance``). It is mapped back to
the acceptance scale and written as the same gate file the labelled calibration writes.

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
- the posteriors cross at P between the two means.

What it cannot know: whether the upper mode *is* the right drafts. A model confidently wrong
on a whole class of queries puts them in the upper mode and the gate accepts them. The
calibration's dictionary carries the mixture's own estimate of the accepted drafts'
accuracy (the mean posterior of the upper component among them), which is only as good as
that assumption; `docs/reproduction.md` says when to trust it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .calibration import Calibration, draft_token_depth, raw_draft_score
from .drift import ScoreDistribution
from .separability import DEFAULT_ALPHA, DEFAULT_TAU, acceptance_score

__all__ = [
    "Bimodality",
    "Mixture",
    "NotBimodal",
    "bimodality",
    "calibrate_unlabelled",
    "fit_mixture",
    "label_free_tau",
]

MIN_DRAFTS = 30
MIN_DELTA_BIC = 10.0
MIN_ASHMAN_D = 2.0
MIN_WEIGHT = 0.05
# the published tau on the separability scale: a lower mode above it is not "unsure drafts"
UNSURE_BELOW = math.log(DEFAULT_TAU / (1 - DEFAULT_TAU)) / DEFAULT_ALPHA


class NotBimodal(ValueError):
    """The drafts' scores show no second mode: a label-free tau would be a guess."""


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


def label_free_tau(
    scores: Sequence[float] | np.ndarray,
    *,
    posterior: float = 0.5,
    target_acceptance: float | None = None,
) -> tuple[float, Mixture, Bimodality]:
    """(tau on the separability scale, the fit, the criterion), or :class:`NotBimodal`."""
    if not 0 < posterior < 1:
        raise ValueError("posterior must be in (0, 1)")
    if target_acceptance is not None and not 0 < target_acceptance < 1:
        raise ValueError("target_acceptance must be in (0, 1)")
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
    if target_acceptance is not None:
        tau = float(np.quantile(x, 1 - target_acceptance))
    elif not failures:
        tau = mixture.crossing(posterior)
        if tau is None:
            failures.append(f"the posteriors never reach {posterior:g} between the two means")
    if failures:
        raise NotBimodal(
            "no label-free tau: the drafts' separability has no clear mode of unsure drafts ("
            + "; ".join(failures)
            + ")"
            + ". A threshold would be a guess here; calibrate with labels instead "
            "(speceyes calibrate RUN --max-drop EPS --baseline AGENT_RUN)"
        )
    assert tau is not None
    return tau, mixture, check


def _stage(records, key, aggregation, k, posterior, target_acceptance, alpha):
    raw = [raw_draft_score(r, aggregation, k, key) for r in records]
    raw = [s for s in raw if s is not None]
    tau_raw, mixture, check = label_free_tau(
        raw, posterior=posterior, target_acceptance=target_acceptance
    )
    tau = acceptance_score(tau_raw, alpha)
    x = np.asarray(raw)
    accepted = np.asarray([acceptance_score(s, alpha) > tau for s in x])  # the gate's own test
    summary = {
        "n_drafts": len(x),
        "accepted_of_drafts": float(accepted.mean()),
        "tau_separability": tau_raw,
        # the mixture's own estimate, valid only if the upper mode is the right drafts
        "modelled_accuracy_of_accepted": (
            float(mixture.posterior_upper(x[accepted]).mean()) if accepted.any() else None
        ),
    }
    fit = {**asdict(mixture), **asdict(check), "bimodal": check.bimodal}
    return tau, summary, fit, ScoreDistribution.from_scores(raw, tau, alpha)


def calibrate_unlabelled(
    records: Sequence[dict],
    *,
    aggregation: str = "min",
    k: int | None = None,
    posterior: float = 0.5,
    target_acceptance: float | None = None,
) -> Calibration:
    """A gate from unlabelled drafts (see the module docstring); raises :class:`NotBimodal`.

    With tool drafts (depth-D speculation) their ``tau_depth`` is fitted the same way; when
    they are not bimodal it is 1.0 (no answer after tool steps accepted) and the reason is
    kept in ``depth_mixture["refused"]``: a depth gate nobody can justify stays shut."""
    depth = draft_token_depth(records)
    k = min(k or depth, depth)
    tau, summary, fit, distribution = _stage(
        records, "draft", aggregation, k, posterior, target_acceptance, DEFAULT_ALPHA
    )
    method = "two-component Gaussian mixture on the separability scale, " + (
        f"tau at {target_acceptance:.0%} acceptance"
        if target_acceptance is not None
        else f"tau where P(upper component) = {posterior:g}"
    )
    result = Calibration(
        tau=float(tau),
        aggregation=aggregation,
        k=int(k),
        max_drop=None,
        delta=None,
        n_calibration=len(records),
        method=method,
        loss="none: no labels (no guarantee)",
        calibration=summary,
        mixture=fit,
        distribution=distribution.to_dict(),
    )
    if any(r.get("tool_draft") for r in records):
        try:
            tau_d, summary_d, fit_d, dist_d = _stage(
                records, "tool_draft", aggregation, k, posterior, target_acceptance, DEFAULT_ALPHA
            )
        except NotBimodal as exc:
            result.tau_depth, result.depth_mixture = 1.0, {"refused": str(exc)}
        else:
            result.tau_depth = float(tau_d)
            result.depth_calibration, result.depth_mixture = summary_d, fit_d
            result.depth_distribution = dist_d.to_dict()
    return result
