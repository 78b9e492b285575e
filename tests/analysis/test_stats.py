"""Each statistic against an independent computation: a formula by hand, a worked
example, or a second implementation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis.stats import (correct_per_s_at_budgets, latency_percentiles, mcnemar_test, paired_bootstrap_diff,
                            t_interval, wilson_interval)


def wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_7_of_10_matches_the_formula_and_the_textbook_values():
    lo, hi = wilson_interval(7, 10)
    assert (lo, hi) == pytest.approx(wilson_by_hand(7, 10), abs=1e-12)
    assert (round(lo, 4), round(hi, 4)) == (0.3968, 0.8922)


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (1, 3), (123, 500)])
def test_wilson_edges(k, n):
    assert wilson_interval(k, n) == pytest.approx(wilson_by_hand(k, n), abs=1e-12)


@pytest.mark.parametrize("n", range(1, 200))
def test_wilson_contains_the_estimate_at_the_edges(n):
    # 0 of 12 computed a lower bound of 2.8e-17 above the estimate: error bars went negative
    assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_wilson_empty_is_nan():
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_wilson_99_percent_is_wider():
    lo95, hi95 = wilson_interval(7, 10)
    lo99, hi99 = wilson_interval(7, 10, conf=0.99)
    assert lo99 < lo95 and hi99 > hi95
    assert (lo99, hi99) == pytest.approx(wilson_by_hand(7, 10, z=sps.norm.ppf(0.995)), abs=1e-12)


def test_t_interval_on_three_values_by_hand():
    # mean 2, sd 1, se 1/sqrt(3), t(0.975, 2) = 4.302653
    lo, hi = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half), abs=1e-9)
    assert (round(lo, 4), round(hi, 4)) == (-0.4841, 4.4841)


def test_t_interval_degenerate_inputs():
    assert all(math.isnan(v) for v in t_interval([5.0]))
    assert t_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)


def test_mcnemar_exact_on_a_2x2_table_by_hand():
    # 5 both right, 1 only a, 6 only b, 3 both wrong: exact two-sided binomial on the
    # 7 discordant pairs: p = 2 * P(X <= 1 | n=7, 1/2) = 2 * 8 / 128 = 0.125.
    a = [1] * 5 + [1] * 1 + [0] * 6 + [0] * 3
    b = [1] * 5 + [0] * 1 + [1] * 6 + [0] * 3
    m = mcnemar_test(a, b)
    assert (m.both, m.only_a, m.only_b, m.neither) == (5, 1, 6, 3)
    assert m.pvalue == pytest.approx(0.125, abs=1e-12)
    assert m.statistic == 1


def test_mcnemar_chi_square_with_continuity_by_hand():
    a = [1] * 5 + [1] * 1 + [0] * 6 + [0] * 3
    b = [1] * 5 + [0] * 1 + [1] * 6 + [0] * 3
    m = mcnemar_test(a, b, exact=False)
    stat = (abs(1 - 6) - 1) ** 2 / 7
    assert m.statistic == pytest.approx(stat)
    assert m.pvalue == pytest.approx(sps.chi2.sf(stat, 1))


def test_mcnemar_without_discordant_pairs_is_p_one():
    m = mcnemar_test([True, False, True], [True, False, True])
    assert m.pvalue == 1.0 and m.only_a == m.only_b == 0


def test_mcnemar_needs_equal_lengths():
    with pytest.raises(ValueError):
        mcnemar_test([True], [True, False])


def _numpy_paired_bootstrap(a, b, n_resamples, seed, conf=0.95):
    """A second implementation: resample pair indices, percentile interval."""
    d = np.asarray(a, float) - np.asarray(b, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_resamples, len(d)))
    means = d[idx].mean(axis=1)
    return np.percentile(means, [50 * (1 - conf), 100 - 50 * (1 - conf)])


def test_paired_bootstrap_agrees_with_an_independent_resampler():
    rng = np.random.default_rng(7)
    a = rng.random(200) < 0.7
    b = np.where(rng.random(200) < 0.8, a, ~a)  # correlated, as paired outcomes are
    res = paired_bootstrap_diff(a, b, n_resamples=20000, seed=1)
    lo, hi = _numpy_paired_bootstrap(a, b, 20000, seed=2)
    assert res.diff == pytest.approx(a.mean() - b.mean())
    assert res.n == 200
    assert res.ci_low == pytest.approx(lo, abs=0.01)
    assert res.ci_high == pytest.approx(hi, abs=0.01)
    # The pairing matters: the unpaired interval of the difference is much wider.
    se_unpaired = math.sqrt(a.mean() * (1 - a.mean()) / 200 + b.mean() * (1 - b.mean()) / 200)
    assert res.ci_high - res.ci_low < 2 * 1.96 * se_unpaired


def test_paired_bootstrap_is_seeded_and_degenerate_cases_are_points():
    a, b = [1, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 1]
    assert paired_bootstrap_diff(a, b, seed=3) == paired_bootstrap_diff(a, b, seed=3)
    same = paired_bootstrap_diff([1, 0, 1], [1, 0, 1])
    assert (same.diff, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)
    assert math.isnan(paired_bootstrap_diff([], []).diff)


def test_latency_percentiles_by_hand():
    # numpy's linear rule on 1..10: position (n-1) q -> 5.5, 9.1, 9.91
    assert latency_percentiles(range(1, 11)) == pytest.approx(
        {"latency_p50_s": 5.5, "latency_p90_s": 9.1, "latency_p99_s": 9.91})
    assert math.isnan(latency_percentiles([])["latency_p99_s"])


def test_correct_per_s_at_budgets_worked_example():
    # Correct within L, per second of a 2 s makespan; the ungraded request never counts.
    got = correct_per_s_at_budgets([1.0, 2.0, 3.0, 4.0], [True, False, True, None], 2.0, [0.5, 1.0, 3.0, 10.0])
    assert got == {0.5: 0.0, 1.0: 0.5, 3.0: 1.0, 10.0: 1.0}
    assert all(math.isnan(v) for v in correct_per_s_at_budgets([1.0], [True], 0.0, [1.0]).values())


def test_cluster_bootstrap_resamples_problems_with_all_their_seeds():
    # 40 problems, 4 seeds each, outcomes identical across a problem's seeds: the seeds
    # add no information, so the clustered interval matches the one-seed interval, and
    # resampling the 160 pairs as independent would be about twice too narrow.
    rng = np.random.default_rng(0)
    a1, b1 = rng.random(40) < 0.6, rng.random(40) < 0.4
    a, b = np.repeat(a1, 4).astype(float), np.repeat(b1, 4).astype(float)
    problems = np.repeat(np.arange(40), 4)
    one_seed = paired_bootstrap_diff(a1.astype(float), b1.astype(float), seed=2)
    naive = paired_bootstrap_diff(a, b, seed=2)
    clustered = paired_bootstrap_diff(a, b, seed=2, clusters=problems)
    width = lambda r: r.ci_high - r.ci_low  # noqa: E731
    assert clustered.diff == naive.diff == one_seed.diff
    assert width(clustered) == pytest.approx(width(one_seed), rel=0.15)
    assert width(clustered) > 1.6 * width(naive)
