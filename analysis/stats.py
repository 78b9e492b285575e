"""Statistics for the analysis (docs/paper.md §10.1, §12.3): pure functions on arrays.

Library implementations where they exist (statsmodels Wilson and McNemar, scipy's
t distribution and paired bootstrap), so the numbers are the textbook ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar as _sm_mcnemar

from specscale.metrics.summary import wilson_interval as _wilson

PERCENTILES = (50, 90, 99)


def wilson_interval(successes: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (nan, nan) when n == 0 (the
    harness's own, so a summary's interval and the report's are the same numbers)."""
    return _wilson(int(successes), int(n), alpha=1 - conf)


def t_interval(values: Sequence[float], conf: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval for the mean of values (e.g. one value per seed).
    Needs at least two values; a zero spread gives a zero-width interval."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    mean, se = x.mean(), x.std(ddof=1) / np.sqrt(len(x))
    half = sps.t.ppf(0.5 + conf / 2, df=len(x) - 1) * se
    return float(mean - half), float(mean + half)


@dataclass(frozen=True)
class McNemar:
    both: int         # a and b correct
    only_a: int       # a correct, b wrong
    only_b: int       # a wrong, b correct
    neither: int
    statistic: float
    pvalue: float
    exact: bool


def mcnemar_test(a_correct: Sequence[bool], b_correct: Sequence[bool], exact: bool = True) -> McNemar:
    """McNemar's test on paired binary outcomes (same problems, same seeds).

    Exact (binomial on the discordant pairs) by default: the discordant counts of a
    few hundred problems are small, where the chi-square approximation is poor. With no
    discordant pair the two policies agree on every problem: p = 1."""
    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need equal lengths, got {a.shape} and {b.shape}")
    n11, n10 = int(np.sum(a & b)), int(np.sum(a & ~b))
    n01, n00 = int(np.sum(~a & b)), int(np.sum(~a & ~b))
    if n10 + n01 == 0:
        return McNemar(n11, n10, n01, n00, 0.0, 1.0, exact)
    res = _sm_mcnemar([[n11, n10], [n01, n00]], exact=exact, correction=True)
    return McNemar(n11, n10, n01, n00, float(res.statistic), float(min(1.0, res.pvalue)), exact)


@dataclass(frozen=True)
class PairedDiff:
    mean_a: float
    mean_b: float
    diff: float       # mean(a - b)
    ci_low: float
    ci_high: float
    n: int


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], conf: float = 0.95,
                          n_resamples: int = 4000, seed: int = 0,
                          clusters: Optional[Sequence[Any]] = None) -> PairedDiff:
    """Percentile bootstrap interval of mean(a - b), resampling pairs (scipy, paired=True),
    or, given ``clusters`` (one label per pair, e.g. the problem id), resampling whole
    clusters: the seeds of one problem share its difficulty, so they are not independent
    pairs, and resampling them as such understates the interval.

    Seeded, so a report is reproducible. Percentile rather than BCa: with binary
    outcomes and few discordant pairs, BCa's acceleration estimate degenerates."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {x.shape} and {y.shape}")
    n = len(x)
    if n == 0:
        nan = float("nan")
        return PairedDiff(nan, nan, nan, nan, nan, 0)
    d = x - y
    diff = float(d.mean())
    if n == 1 or np.all(d == d[0]):
        # Every resample has the same mean: the interval is the point (scipy would warn).
        return PairedDiff(float(x.mean()), float(y.mean()), diff, diff, diff, n)
    if clusters is not None:
        low, high = _cluster_bootstrap(d, clusters, conf, n_resamples, seed)
        return PairedDiff(float(x.mean()), float(y.mean()), diff, low, high, n)
    res = sps.bootstrap((x, y), _mean_diff, paired=True, vectorized=True, confidence_level=conf,
                        n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return PairedDiff(float(x.mean()), float(y.mean()), diff, float(ci.low), float(ci.high), n)


def _cluster_bootstrap(d: np.ndarray, clusters: Sequence[Any], conf: float, n_resamples: int,
                       seed: int) -> tuple[float, float]:
    """Percentile interval of the pooled mean of d, resampling clusters with replacement."""
    labels = np.asarray(clusters)
    if labels.shape != d.shape:
        raise ValueError(f"clusters need one label per pair, got {labels.shape} for {d.shape}")
    _, inverse = np.unique(labels, return_inverse=True)
    sums, counts = np.bincount(inverse, weights=d), np.bincount(inverse).astype(float)
    draws = np.random.default_rng(seed).integers(0, len(sums), size=(n_resamples, len(sums)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    alpha = (1 - conf) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def _mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def latency_percentiles(latencies_s: Sequence[float], percentiles: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """Raw end-to-end latency percentiles (linear interpolation, numpy's default, the
    same rule the harness's summary uses): {'latency_p50_s': ..., ...}."""
    lat = np.asarray(latencies_s, dtype=float)
    return {f"latency_p{p}_s": (float(np.percentile(lat, p)) if len(lat) else float("nan")) for p in percentiles}


def correct_per_s_at_budgets(latencies_s: Sequence[float], correct: Sequence[bool], makespan_s: float,
                             budgets_s: Sequence[float]) -> dict[float, float]:
    """Review §12.3: requests answered correctly within latency budget L, per second of
    makespan, for each L. Ungraded requests (None) count as not correct."""
    lat = np.asarray(latencies_s, dtype=float)
    ok = np.asarray([bool(c) if c is not None and c == c else False for c in correct], dtype=bool)
    if lat.shape != ok.shape:
        raise ValueError("latencies and correctness need equal lengths")
    if not makespan_s or makespan_s <= 0:
        return {float(b): float("nan") for b in budgets_s}
    return {float(b): float(np.sum(ok & (lat <= b)) / makespan_s) for b in budgets_s}
