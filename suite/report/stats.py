"""Confidence intervals of a mean over seeds: Student-t for few seeds, percentile bootstrap for many.

With a handful of seeds the percentile bootstrap is far too narrow: at n = 2 its 95% interval
is exactly [min, max] (the resample means are a, (a+b)/2, b with probabilities 1/4, 1/2, 1/4),
and on normal data it covers the mean about 52% of the time at n = 2, 76% at n = 3, 90% at
n = 10 and 93% at n = 20 (docs/reports.md, "Intervals"). The Student-t interval
(Student 1908; mean +- t_{0.975, n-1} * s / sqrt(n)) is exact for normal data at every n, so it
is used below BOOTSTRAP_MIN_N seeds; from there on the percentile bootstrap (Efron & Tibshirani
1993, ch. 13; rliable's choice for RL scores) is within about two points of nominal coverage
and does not assume normality (e.g. a few collapsed seeds at reward 0).
"""

from __future__ import annotations

import math

import numpy as np

# in the package root: `suite report -h` names it without numpy
from suite.report import BOOTSTRAP_MIN_N  # noqa: F401

LEVEL = 0.95  # confidence level of every interval in the report
N_RESAMPLES = 10_000  # bootstrap resamples (>= 2,000 for stable 2.5% / 97.5% percentiles)
CI_SEED = 0  # bootstrap seed: the same runs always give the same interval
T_METHOD = "t"  # `ci_method` values of the tables
BOOTSTRAP_METHOD = "bootstrap"


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[~np.isnan(x)]


def t_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """Student-t confidence interval of the mean: mean +- t_{(1+level)/2, n-1} * s / sqrt(n),
    with s the sample standard deviation (ddof = 1). Fewer than two values give (nan, nan)."""
    from scipy import stats

    x = _finite(values)
    if x.size < 2:
        return (math.nan, math.nan)
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    m = float(x.mean())
    return (m - half, m + half)


def bootstrap_ci(values, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED,
                 level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of `values`: `scipy.stats.bootstrap`
    (method "percentile", `n_resamples` resamples of len(values) with replacement, numpy
    Generator(PCG64) seeded with `seed`): the (1-level)/2 and (1+level)/2 percentiles of the
    resample means. One value gives (x, x); none gives (nan, nan).
    """
    x = _finite(values)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    from scipy import stats

    ci = stats.bootstrap((x,), np.mean, n_resamples=n_resamples, method="percentile", confidence_level=level,
                         vectorized=True, random_state=np.random.default_rng(seed)).confidence_interval
    return (float(ci.low), float(ci.high))


def mean_ci(values, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED,
            min_bootstrap: int = BOOTSTRAP_MIN_N) -> tuple[float, float, float, str]:
    """(mean, ci_low, ci_high, method) of `values`: the t-interval below `min_bootstrap` values,
    the percentile bootstrap from there; one value has no interval (nan, nan, method "")."""
    x = _finite(values)
    if x.size == 0:
        return (math.nan, math.nan, math.nan, "")
    if x.size == 1:
        return (float(x[0]), math.nan, math.nan, "")
    if x.size >= min_bootstrap:
        return (float(x.mean()), *bootstrap_ci(x, n_resamples, seed), BOOTSTRAP_METHOD)
    return (float(x.mean()), *t_interval(x), T_METHOD)


def describe(n_resamples: int = N_RESAMPLES, seed: int = CI_SEED) -> str:
    """The interval method in words, for table captions."""
    return (f"{LEVEL:.0%} CI of the mean over seeds: Student-t (mean +- t(0.975, n-1) s / sqrt(n)) for "
            f"n < {BOOTSTRAP_MIN_N} seeds, percentile bootstrap ({n_resamples} resamples, seed {seed}) for "
            f"n >= {BOOTSTRAP_MIN_N}; one seed has no interval")
