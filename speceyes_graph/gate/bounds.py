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

import numpy as np

__all__ = ["count_upper_bound", "upper_bound"]

# scipy.stats is imported where it is used: it takes longer to import than this whole
# package, and most processes that import the package never compute a bound.


def upper_bound(errors: np.ndarray, trials: np.ndarray, delta: float) -> np.ndarray:
    """Exact (Clopper-Pearson) one-sided upper confidence bounds at level ``delta`` on the
    share of errors, elementwise: the largest share under which seeing at most ``errors`` in
    ``trials`` has chance at least ``delta``; 1 where there are no trials. Conservative for
    a sample drawn without replacement from a finite set (a window's accepted drafts)."""
    from scipy.stats import beta

    errors, trials = np.asarray(errors, dtype=float), np.asarray(trials, dtype=float)
    certain = (trials <= 0) | (errors >= trials)
    with np.errstate(invalid="ignore"):  # where certain, the quantile is not asked for
        bound = beta.ppf(1 - delta, errors + 1, np.where(certain, 1, trials - errors))
    return np.where(certain, 1.0, bound).reshape(errors.shape)


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
            _most_errors(int(k), int(n), int(p), float(delta))
            for k, n, p in zip(errors.ravel(), sample.ravel(), population.ravel())
        ],
        dtype=float,
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


@functools.lru_cache(maxsize=65536)  # a gate asks the same few again and again
def _most_errors(errors: int, sample: int, population: int, delta: float) -> int:
    """The hypergeometric test inverted: the chance of at most ``errors`` falls as the
    group's errors rise, so the bound is the last count where it is still ``delta``.
    SciPy has the test (``hypergeom.cdf``, the tests' reference) but no inverse in the
    group's count, and a search over its cdf is several times slower than this one
    (docs/throughput.md, ``scripts/bench_internals.py``); the online gate asks one for every
    candidate tau."""
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
