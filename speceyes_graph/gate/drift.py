"""Has traffic moved away from the gate's calibration? Two tests on the drafts' scores.

A tau chosen on one run (with labels or without) is only as good as the next run's drafts
are like the calibration ones. The gate file keeps a summary of the calibration drafts'
scores (:class:`ScoreDistribution`, on the separability scale); ``speceyes report RUN
--against GATEFILE`` compares a run with it:

- **the distribution**: the two-sample Kolmogorov-Smirnov statistic (the largest gap
  between the two empirical CDFs) and its asymptotic p-value, Stephens' small-sample
  correction included. Chosen because it assumes nothing about the scores' shape (they are
  bimodal, skewed, clipped) and is blind to the scale, so a move in either mode shows.
- **acceptance**: the share of drafts above tau, calibration against run, with the pooled
  two-proportion z-test: what the operator pays for when it moves.

Either p-value below ``level`` (default 0.01) is a warning. A warning says the gate's
calibration no longer describes the traffic, not that the gate is wrong: recalibrate on
the new traffic before trusting its accuracy. Compare like with like: drafts of a
``--mode speceyes`` run are the judge's tool-free queries only, those of ``--mode small``
are all queries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .separability import DEFAULT_ALPHA, acceptance_score

__all__ = [
    "DriftCheck",
    "ScoreDistribution",
    "accepted_share",
    "check_drift",
    "ks_two_sample",
    "two_proportion_test",
]

MAX_POINTS = 1000  # order statistics kept in a gate file: CDF resolution 0.1%


@dataclass(frozen=True)
class ScoreDistribution:
    """The calibration drafts' scores in a gate file: ``n``, and up to :data:`MAX_POINTS`
    evenly spaced order statistics (all of them when there are fewer), which reproduce
    the empirical CDF to within 1/MAX_POINTS; ``accepted``: the share above tau."""

    n: int
    points: tuple[float, ...]
    accepted: float
    mean: float
    std: float

    @classmethod
    def from_scores(
        cls, scores: Sequence[float], tau: float, alpha: float = DEFAULT_ALPHA
    ) -> ScoreDistribution:
        x = np.sort(np.asarray([s for s in scores if math.isfinite(s)], dtype=float))
        if len(x) > MAX_POINTS:
            x_kept = np.quantile(x, np.linspace(0, 1, MAX_POINTS))
        else:
            x_kept = x
        return cls(
            n=len(x),
            points=tuple(round(float(v), 6) for v in x_kept),
            accepted=accepted_share(x, tau, alpha),
            mean=float(x.mean()) if len(x) else math.nan,
            std=float(x.std()) if len(x) else math.nan,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": "separability: aggregated per draft, before the sigmoid",
            "n": self.n,
            "accepted": self.accepted,
            "mean": self.mean,
            "std": self.std,
            "points": list(self.points),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScoreDistribution:
        return cls(
            int(data["n"]), tuple(data["points"]), float(data["accepted"]),
            float(data["mean"]), float(data["std"]),
        )  # fmt: skip


def accepted_share(
    scores: Sequence[float] | np.ndarray, tau: float, alpha: float = DEFAULT_ALPHA
) -> float:
    """Share of separability scores the gate accepts: exactly its test, sigmoid(alpha S) > tau."""
    return (
        float(np.mean([acceptance_score(s, alpha) > tau for s in scores])) if len(scores) else 0.0
    )


def _kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for the Kolmogorov distribution (its alternating series)."""
    if lam < 0.2:
        return 1.0
    total = sum(2 * (-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam) for j in range(1, 101))
    return min(1.0, max(0.0, total))


def ks_two_sample(
    a: Sequence[float] | np.ndarray, b: Sequence[float], n_b: int | None = None
) -> tuple[float, float]:
    """(D, asymptotic p-value) of the two-sample Kolmogorov-Smirnov test. ``n_b``: the size
    ``b`` stands for when it is a summary of a larger sample (:class:`ScoreDistribution`)."""
    x, y = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if len(x) == 0 or len(y) == 0:
        raise ValueError("both samples need at least one score")
    grid = np.concatenate([x, y])
    gap = np.abs(
        np.searchsorted(x, grid, side="right") / len(x)
        - np.searchsorted(y, grid, side="right") / len(y)
    )
    d = float(gap.max())
    n, m = len(x), n_b or len(y)
    en = math.sqrt(n * m / (n + m))
    return d, _kolmogorov_sf((en + 0.12 + 0.11 / en) * d)


def two_proportion_test(k1: float, n1: int, k2: float, n2: int) -> float:
    """Two-sided p-value of "same proportion" (pooled z-test; 1.0 when undefined)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0
    z = abs(k1 / n1 - k2 / n2) / se
    return math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class DriftCheck:
    """What :func:`check_drift` found; ``warnings`` is empty when nothing moved."""

    n: int
    n_calibration: int
    ks_statistic: float
    ks_pvalue: float
    accepted: float
    accepted_calibration: float
    acceptance_pvalue: float
    level: float
    warnings: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def check_drift(
    scores: Sequence[float | None],
    reference: ScoreDistribution,
    tau: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    level: float = 0.01,
    what: str = "drafts",
) -> DriftCheck:
    """Compare a run's scores (separability scale) with the gate's calibration summary;
    ``tau`` on the acceptance scale, as in the gate file."""
    x = np.asarray([s for s in scores if s is not None and math.isfinite(s)], dtype=float)
    if len(x) == 0 or reference.n == 0:
        raise ValueError(f"no {what} with log-probs to compare")
    d, p = ks_two_sample(x, reference.points, n_b=reference.n)
    accepted = accepted_share(x, tau, alpha)
    p_acc = two_proportion_test(
        accepted * len(x), len(x), reference.accepted * reference.n, reference.n
    )
    warnings = []
    if p < level:
        warnings.append(
            f"the {what}' score distribution has moved (Kolmogorov-Smirnov D {d:.3f}, "
            f"p {p:.2g} < {level:g}): the gate was calibrated on other traffic; recalibrate"
        )
    if p_acc < level:
        warnings.append(
            f"acceptance of {what} moved from {reference.accepted:.1%} to {accepted:.1%} "
            f"(two-proportion p {p_acc:.2g} < {level:g})"
        )
    return DriftCheck(
        len(x), reference.n, d, p, accepted, reference.accepted, p_acc, level, tuple(warnings)
    )
