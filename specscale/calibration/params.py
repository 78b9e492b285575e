"""The sim constants a calibration may move: config key, bounds, scale.

Each is a MODEL constant of conf/engine/sim.yaml; a fit moves it inside its bounds
(chosen as the physically plausible range, not to make a target reachable) and records
the fitted value, so a calibrated profile says where each number came from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class FitParam:
    key: str  # config key under engine. (e.g. "cost.gen_iteration_overhead_s")
    low: float
    high: float
    log: bool = True  # searched on a log scale (constants spanning orders of magnitude)
    why: str = ""

    def __post_init__(self) -> None:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(f"{self.key}: bounds [{self.low}, {self.high}] are empty or not positive for a log scale")

    @property
    def override_key(self) -> str:
        return f"engine.{self.key}"

    def to_unit(self, value: float) -> float:
        """value -> [0, 1] inside the bounds (the optimiser's coordinate)."""
        if self.log:
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        return self.low + u * (self.high - self.low)

    def at_bound(self, value: float, tol: float = 1e-3) -> bool:
        u = self.to_unit(value)
        return u <= tol or u >= 1 - tol


# The calibrated constants (at most 8).
SIM_PARAMS: tuple[FitParam, ...] = (
    FitParam("cost.gen_iteration_overhead_s", 2e-4, 0.05, why="launch/scheduling per generation iteration"),
    FitParam("cost.prm_batch_overhead_s", 5e-4, 0.1, why="fixed cost per PRM batch"),
    FitParam("cost.prm_half_efficiency_tokens", 8.0, 4096.0, why="PRM batch efficiency n/(n+h)"),
    FitParam("cost.bandwidth_efficiency", 0.3, 1.0, log=False, why="achieved share of HBM bandwidth"),
    FitParam("cost.host_iteration_s", 1e-5, 0.05, why="host work per iteration (other)"),
    FitParam("cost.host_prm_task_s", 1e-6, 0.02, why="PRM input building per task (tokenization)"),
    FitParam("synthetic.token_overlap", 0.3, 0.99, log=False, why="P(siblings draw the same token)"),
)


def overrides_for(params: Sequence[FitParam], values: Sequence[float]) -> list[str]:
    return [f"{p.override_key}={float(v)!r}" for p, v in zip(params, values)]
