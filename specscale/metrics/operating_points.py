"""Operating points read off a sweep: where a serving curve crosses a latency level, and
where a concurrency curve saturates.

One definition serves the analysis figures (analysis.fig_serving, analysis.fig_concurrency)
and the sim's held-out validation targets (specscale.calibration.targets), so the report
and the validation table can never read the same curve two ways.
"""
from __future__ import annotations

import numpy as np

SATURATION_SHARE = 0.95  # "saturated": within 5% of the best throughput of the sweep


def rate_at_latency(rates: np.ndarray, latency: np.ndarray, level: float) -> tuple[float, str]:
    """The request rate at which the curve reaches `level`, by linear interpolation
    between the measured rates. ('>' r_max) when it stays below the level, ('<' r_min)
    when it starts above."""
    order = np.argsort(rates)
    r, y = np.asarray(rates, dtype=float)[order], np.asarray(latency, dtype=float)[order]
    ok = ~np.isnan(y)
    r, y = r[ok], y[ok]
    if len(r) == 0:
        return float("nan"), ""
    if y[0] > level:
        return float(r[0]), "<"
    above = np.nonzero(y > level)[0]
    if len(above) == 0:
        return float(r[-1]), ">"
    i = above[0]
    frac = (level - y[i - 1]) / (y[i] - y[i - 1])
    return float(r[i - 1] + frac * (r[i] - r[i - 1])), "="


def saturation_point(concurrency: np.ndarray, throughput: np.ndarray) -> tuple[float, str]:
    """(concurrency, relation): the smallest concurrency within SATURATION_SHARE of the
    best throughput; '~' saturated there, '>=' still rising at the largest tested."""
    order = np.argsort(concurrency)
    c, t = np.asarray(concurrency, dtype=float)[order], np.asarray(throughput, dtype=float)[order]
    if len(c) == 0 or np.all(np.isnan(t)):
        return float("nan"), ""
    first = int(np.nonzero(t >= SATURATION_SHARE * np.nanmax(t))[0][0])
    return float(c[first]), ("~" if first < len(c) - 1 else ">=")
