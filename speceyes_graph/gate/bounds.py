"""Exact upper confidence bounds on a share of errors (Clopper-Pearson), as the online gate
and its tests use them: exact where the normal approximations (Agresti-Coull, Wilson) miss
their level at the small error counts a gate sees (docs/calibration.md)."""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["upper_bound"]


@functools.lru_cache(maxsize=65536)
def _clopper_pearson(errors: int, trials: int, delta: float) -> float:
    if trials <= 0 or errors >= trials:
        return 1.0
    j = np.arange(errors + 1)
    log_choose = (
        math.lgamma(trials + 1) - np.array([math.lgamma(x + 1) for x in j])
        - np.array([math.lgamma(trials - x + 1) for x in j])
    )  # fmt: skip

    def cdf(q: float) -> float:  # P(Binomial(trials, q) <= errors)
        return float(np.exp(log_choose + j * math.log(q) + (trials - j) * math.log1p(-q)).sum())

    lo, hi = errors / trials, 1.0
    for _ in range(60):  # bisection to ~1e-18: the cdf falls as q rises
        mid = (lo + hi) / 2
        if mid >= 1.0 or cdf(mid) < delta:
            hi = mid
        else:
            lo = mid
    return hi


def upper_bound(errors: np.ndarray, trials: np.ndarray, delta: float) -> np.ndarray:
    """Exact (Clopper-Pearson) one-sided upper confidence bounds at level ``delta`` on the
    share of errors, elementwise: the largest share under which seeing at most ``errors`` in
    ``trials`` has chance at least ``delta``; 1 where there are no trials. Conservative for
    a sample drawn without replacement from a finite set (a window's accepted drafts)."""
    errors, trials = np.asarray(errors), np.asarray(trials)
    return np.array(
        [_clopper_pearson(int(k), int(n), float(delta)) for k, n in zip(errors, trials)]
    ).reshape(errors.shape)
