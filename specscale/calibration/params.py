"""The sim constants a calibration may move: config key, bounds, scale.

Each is a MODEL constant of conf/engine/sim.yaml; a fit moves it inside its bounds
(chosen as the physically plausible range, not to make a target reachable) and records
the fitted value, so a calibrated profile says where each number came from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class FitParam:
    key: str  # config key under engine. (e.g. "cost.gen_iteration_overhead_s"), or under the model's sim.workload
    low: float
    high: float
    log: bool = True  # searched on a log scale (constants spanning orders of magnitude)
    why: str = ""
    # A model pair's own constant (model.sim.workload.<key>): moved only in that pair's
    # cells and fitted only to its targets' cells; None: an engine constant, every cell.
    model: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(f"{self.key}: bounds [{self.low}, {self.high}] are empty or not positive for a log scale")

    @property
    def override_key(self) -> str:
        return f"++model.sim.workload.{self.key}" if self.model else f"engine.{self.key}"

    @property
    def name(self) -> str:
        """How reports and profiles name it: model-scoped keys carry their pair."""
        return f"{self.model}:{self.key}" if self.model else self.key

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
    # Qwen2.5-3B shares the 7B's PRM but writes its own solutions: its step length is its
    # own, fitted only to its nonspec number (the workload per model pair).
    FitParam("step_len_median", 8.0, 200.0, why="Qwen2.5-3B's tokens per step", model="qwen2.5-3b"),
)


def overrides_for(params: Sequence[FitParam], values: Sequence[float]) -> list[str]:
    """Command-line overrides of the constants; a model pair's constant is written
    ``model=<name>::<override>`` and applied only to that pair's cells (``scoped``)."""
    return [f"{'model=' + p.model + SCOPE if p.model else ''}{p.override_key}={float(v)!r}"
            for p, v in zip(params, values)]


SCOPE = "::"


def scoped(overrides: Sequence[str], cell_overrides: Sequence[str]) -> list[str]:
    """The overrides that apply to a cell: unscoped ones, and scoped ones whose
    ``model=<name>`` the cell's own overrides name."""
    models = [o for o in cell_overrides if o.startswith("model=")]
    model = models[-1] if models else None  # the last override wins, as on Hydra's command line
    out = []
    for o in overrides:
        scope, sep, rest = o.partition(SCOPE)
        if not sep:
            out.append(o)
        elif scope == model:
            out.append(rest)
    return out
