"""Confidence intervals: the Student-t interval against scipy, and which method a cell gets."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from suite.report import stats as S


def scipy_t(values, level=0.95):
    x = np.asarray(values, dtype=float)
    return stats.t.interval(level, x.size - 1, loc=x.mean(), scale=stats.sem(x))


@pytest.mark.parametrize("values", [[55.1, 53.9], [55.1, 53.9, 57.2], [0.2, 0.6], [31.0, 31.5, 29.75],
                                    [1.0, 2.0, 4.0, 8.0, 16.0]])
def test_t_interval_is_scipys(values):
    np.testing.assert_allclose(S.t_interval(values), scipy_t(values), rtol=1e-13, atol=0)


@pytest.mark.parametrize("values", [[55.1, 53.9], [55.1, 53.9, 57.2], [0.2, 0.6], [10.0, 10.5, 12.0]])
def test_few_seeds_get_an_interval_wider_than_min_max(values):
    mean, lo, hi, method = S.mean_ci(values)
    assert method == S.T_METHOD
    assert lo < min(values) and hi > max(values)
    # the percentile bootstrap it replaces is [min, max] or narrower at n = 2..3
    blo, bhi = S.bootstrap_ci(values)
    assert min(values) - 1e-12 <= blo and bhi <= max(values) + 1e-12


def test_the_worked_example():
    # mean 55.4, s^2 = (0.09 + 2.25 + 3.24) / 2 = 2.79, t(0.975, 2) = 4.302652729... (Student's table):
    # 55.4 +- 4.302652729 * sqrt(2.79 / 3) = [51.25, 59.55], where the bootstrap says [53.9, 57.2]
    mean, lo, hi, method = S.mean_ci([55.1, 53.9, 57.2])
    half = 4.302652729 * (2.79 / 3) ** 0.5
    assert mean == pytest.approx(55.4, rel=1e-12)
    np.testing.assert_allclose((lo, hi), (55.4 - half, 55.4 + half), rtol=1e-9)
    np.testing.assert_allclose(S.bootstrap_ci([55.1, 53.9, 57.2]), (53.9, 57.2), rtol=1e-12)


def test_method_switches_at_the_threshold():
    rng = np.random.default_rng(3)
    below = rng.normal(50, 5, S.BOOTSTRAP_MIN_N - 1)
    at = rng.normal(50, 5, S.BOOTSTRAP_MIN_N)
    m, lo, hi, method = S.mean_ci(below)
    assert method == S.T_METHOD
    np.testing.assert_allclose((lo, hi), scipy_t(below), rtol=1e-13)
    m, lo, hi, method = S.mean_ci(at, n_resamples=5000, seed=7)
    assert method == S.BOOTSTRAP_METHOD and (lo, hi) == S.bootstrap_ci(at, 5000, 7)
    assert m == pytest.approx(at.mean(), rel=1e-12)


def test_one_or_no_value_has_no_interval():
    mean, lo, hi, method = S.mean_ci([0.3])
    assert mean == 0.3 and np.isnan(lo) and np.isnan(hi) and method == ""
    assert all(np.isnan(v) for v in S.mean_ci([])[:3])
    assert all(np.isnan(v) for v in S.t_interval([0.3]))
    # NaNs (a run that logged no accuracy) are not values
    np.testing.assert_allclose(S.t_interval([1.0, np.nan, 3.0]), scipy_t([1.0, 3.0]), rtol=1e-13)


def test_zero_spread_gives_a_point_interval():
    assert S.t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)


def test_caption_states_the_method_and_threshold():
    text = S.describe(10_000, 0)
    assert "Student-t" in text and f"n < {S.BOOTSTRAP_MIN_N}" in text and "percentile bootstrap" in text
    assert "10000 resamples, seed 0" in text
