"""Exact upper confidence bounds on errors, as the online gate and its tests use them: exact
where the normal approximations (Agresti-Coull, Wilson) miss their level at the small error
counts a gate sees (docs/calibration.md).

- :func:`upper_bound`: Clopper-Pearson, on the share of errors in a binomial sample;
- :func:`count_upper_bound`: on the number of errors in a finite group, from a uniform
  sample of it drawn without replacement (the hypergeometric test inverted). The gate's
  shadowed drafts are such a sample of the accepted ones, and this bound is the tighter:
  a group labelled in full is counted exactly, and one labelled at chance c is never
  certified below ``ln(1/delta) / -ln(1 - c)`` errors where Clopper-Pearson's floor is
  ``ln(1/delta) / c`` (3.3 against 4.6 at c = 0.5, delta = 0.1)."""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["count_upper_bound", "upper_bound"]


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


_log_factorials = np.zeros(1)


def _log_factorial(n: int) -> np.ndarray:
    """log(k!) for k = 0..n at least, from a table grown as needed. Gates in several threads
    may grow it at once: each returns the table it read or built (long enough for it), and
    the shared one is only ever replaced by a longer one."""
    global _log_factorials
    table = _log_factorials
    if len(table) <= n:
        size = max(n + 1, 2 * len(table))
        table = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, size)))))
        if len(table) > len(_log_factorials):
            _log_factorials = table
    return table


@functools.lru_cache(maxsize=65536)
def _hypergeometric(errors: int, sample: int, population: int, delta: float) -> int:
    if sample <= 0:
        return population
    lf = _log_factorial(population)
    j = np.arange(errors + 1)
    total = lf[population] - lf[sample] - lf[population - sample]

    def cdf(k: int) -> float:  # P(at most `errors` in the sample | k errors in the group)
        jj = j[(j <= k) & (sample - j <= population - k)]
        log_pmf = (
            lf[k] - lf[jj] - lf[k - jj]
            + lf[population - k] - lf[sample - jj] - lf[population - k - sample + jj]
            - total
        )  # fmt: skip
        return float(np.exp(log_pmf).sum())

    lo, hi = errors, population - (sample - errors)  # cdf(lo) = 1 > delta; the largest k
    while lo < hi:  # the cdf falls as k rises: the largest k with cdf(k) >= delta
        mid = (lo + hi + 1) // 2
        if cdf(mid) >= delta:
            lo = mid
        else:
            hi = mid - 1
    return lo


def count_upper_bound(
    errors: np.ndarray, sample: np.ndarray, population: np.ndarray, delta: float
) -> np.ndarray:
    """Exact one-sided upper confidence bounds at level ``delta`` on how many of a group of
    ``population`` are errors, given ``errors`` of a uniform sample of ``sample`` drawn from
    it without replacement, elementwise: the most errors under which seeing at most
    ``errors`` has chance at least ``delta``. ``population`` where nothing was sampled;
    exactly ``errors`` where everything was."""
    errors, sample, population = (np.asarray(a) for a in (errors, sample, population))
    if np.any(sample > population) or np.any(errors > sample):
        raise ValueError("need errors <= sample <= population")
    return np.array(
        [
            _hypergeometric(int(k), int(n), int(p), float(delta))
            for k, n, p in zip(errors.ravel(), sample.ravel(), population.ravel())
        ],
        dtype=float,
    ).reshape(errors.shape)
