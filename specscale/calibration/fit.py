"""Least-squares fit of named sim constants to declared targets (scipy.optimize).

The optimiser works on each constant's unit coordinate inside its bounds (log scale
where the constant spans orders of magnitude) and minimises the sum of squared
*scaled* residuals (``Target.residual``: 1 at the edge of a target's tolerance, 0 inside
a range). The sim is deterministic for a seed, so the objective is too; its
finite-difference steps are coarse (``diff_step``) because token counts move in whole
tokens. After the fit every target gets its residual and pass flag; a target it could
not reach is reported with the constants that sit at a bound, so the cause is named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scipy.optimize import least_squares

from specscale.calibration.params import FitParam
from specscale.calibration.targets import Target


class UnreachableTarget(RuntimeError):
    """A target stays outside its tolerance at the best fit (named with the bounds in the way)."""


@dataclass
class FitResult:
    params: tuple[FitParam, ...]
    values: list[float]
    targets: tuple[Target, ...]
    predicted: list[float]
    cost: float  # 0.5 * sum of squared scaled residuals
    evaluations: int
    message: str
    start: list[float] = field(default_factory=list)
    # scipy's least_squares status: -1 improper input, 0 stopped on the evaluation limit
    # (max_nfev), 1-4 a convergence test held. Reported, because a fit cut off by the
    # limit is a starting point, not a calibration.
    status: int = 0

    @property
    def converged(self) -> bool:
        return self.status > 0

    @property
    def residuals(self) -> list[float]:
        return [t.residual(p) for t, p in zip(self.targets, self.predicted)]

    @property
    def missed(self) -> list[Target]:
        return [t for t, p in zip(self.targets, self.predicted) if not t.passes(p)]

    @property
    def at_bounds(self) -> list[str]:
        return [p.name for p, v in zip(self.params, self.values) if p.at_bound(v)]

    def fitted(self) -> dict[str, float]:
        return {p.name: v for p, v in zip(self.params, self.values)}

    def check(self) -> None:
        """Raise UnreachableTarget naming every missed target and the constants at a bound."""
        if self.missed:
            names = "; ".join(f"{t.name} (paper {t.value:g}, predicted {p:.4g})"
                              for t, p in zip(self.targets, self.predicted) if not t.passes(p))
            bounds = ", ".join(self.at_bounds) or "none (the constants cannot trade these targets off)"
            raise UnreachableTarget(f"unreachable within tolerance: {names}. Constants at a bound: {bounds}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "fitted": {p.name: {"value": v, "low": p.low, "high": p.high, "start": s, "at_bound": p.at_bound(v)}
                       for p, v, s in zip(self.params, self.values, self.start or [math.nan] * len(self.values))},
            "targets": [{"target": t.name, "paper": t.value, "high": t.high, "rule": t.rule, "tol": t.tol,
                         "predicted": p, "residual": t.residual(p), "pass": t.passes(p), "source": t.source}
                        for t, p in zip(self.targets, self.predicted)],
            "cost": self.cost, "evaluations": self.evaluations, "message": self.message,
            "status": self.status, "converged": self.converged,
        }


def fit(params: Sequence[FitParam], targets: Sequence[Target], predict: Callable[[list[float]], list[float]],
        start: Sequence[float], max_evals: int = 60, diff_step: float = 0.03, tol: float = 1e-3,
        progress: Optional[Callable[[int, float], None]] = None) -> FitResult:
    """predict(values) -> one prediction per target. Returns the best constants found."""
    params, targets = tuple(params), tuple(targets)
    if len(params) > 8:
        raise ValueError(f"{len(params)} constants: a calibration fits at most 8")
    for p, v in zip(params, start):
        if not p.low <= v <= p.high:
            raise ValueError(f"start value {v} of {p.name} is outside its bounds [{p.low}, {p.high}]")
    seen: dict[tuple[float, ...], list[float]] = {}
    count = [0]

    def predictions(u: np.ndarray) -> list[float]:
        key = tuple(np.round(u, 12))
        if key not in seen:
            seen[key] = predict([p.from_unit(x) for p, x in zip(params, u)])
            count[0] += 1
        return seen[key]

    def residuals(u: np.ndarray) -> np.ndarray:
        r = np.array([t.residual(p) for t, p in zip(targets, predictions(u))], dtype=float)
        if progress is not None:
            progress(count[0], 0.5 * float(r @ r))
        return r

    u0 = np.array([p.to_unit(v) for p, v in zip(params, start)], dtype=float)
    u0 = np.clip(u0, 1e-6, 1 - 1e-6)  # least_squares needs a strictly feasible start
    # Tolerances at the objective's own resolution: token counts move in whole tokens, so
    # below ~0.1% of the cost (or of a constant's range) the sim's answer is step-shaped
    # and scipy's defaults (1e-8) would only ever stop on max_nfev.
    res = least_squares(residuals, u0, bounds=(0.0, 1.0), diff_step=diff_step, max_nfev=max_evals, x_scale=1.0,
                        ftol=tol, xtol=tol)
    values = [p.from_unit(x) for p, x in zip(params, res.x)]
    return FitResult(params, values, targets, predictions(res.x), float(res.cost), count[0], str(res.message),
                     list(start), status=int(res.status))
