"""The PRM cost curve C(batch) that adaptive verification prices batches with.

A backend that can model a PRM batch exposes ``prm_cost(tasks) -> seconds`` (the sim:
its cost model, the same function that times the batch). A backend that cannot (torch)
gets ``MeasuredPRMCurve``: an affine fit C = α + β·(new tokens) to the PRM batches timed
so far in this run. It is refitted as batches arrive, so the first decisions of a run
use few points: before any batch is timed the curve is zero (waiting gains nothing, so
the first pending tasks flush at once and give the first measurement); with one batch
size seen it assumes that batch was all fixed cost (α = its seconds, β = 0), the
estimate that favours waiting, until a second size is timed.
On torch the build removes that warm-up for adaptive cells: it times a few PRM batch
sizes before serving (``specscale.engine.torch.prm.profile``) and the monitor starts
the curve from those points.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Task = tuple[int, int]  # (new PRM tokens, cached context tokens)
Group = tuple[int, float, float]  # (count, new PRM tokens, cached context tokens) of equal tasks


@dataclass
class MeasuredPRMCurve:
    """Least-squares C(n) = α + β·n over (new tokens, seconds) of this run's PRM batches.
    Running sums only: an update and an evaluation are O(1)."""

    count: int = 0
    sum_n: float = 0.0
    sum_t: float = 0.0
    sum_nn: float = 0.0
    sum_nt: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        self.count += 1
        self.sum_n += tokens
        self.sum_t += seconds
        self.sum_nn += tokens * tokens
        self.sum_nt += tokens * seconds
        self._fit()

    def _fit(self) -> None:
        k = self.count
        var = k * self.sum_nn - self.sum_n * self.sum_n
        if var <= 1e-9 * max(1.0, self.sum_nn):  # one batch size seen so far: all fixed cost
            self.alpha, self.beta = self.sum_t / k, 0.0
            return
        beta = (k * self.sum_nt - self.sum_n * self.sum_t) / var
        beta = max(0.0, beta)  # a PRM batch never gets cheaper with more tokens
        self.beta = beta
        self.alpha = max(0.0, (self.sum_t - beta * self.sum_n) / k)

    @property
    def measured(self) -> bool:
        return self.count > 0

    def __call__(self, tasks: Sequence[Task]) -> float:
        n = sum(t[0] for t in tasks)
        return self.alpha + self.beta * n if n > 0 else 0.0

    def groups(self, groups: Sequence[Group]) -> float:
        """The same curve over (count, new tokens, cached) groups of equal tasks."""
        n = sum(k * t for k, t, _ in groups)
        return self.alpha + self.beta * n if n > 0 else 0.0
