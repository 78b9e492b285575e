"""A cost model predicted from measurements of a real engine (``hardware=profiled/<name>``).

The roofline (cost_model.py) prices hardware nobody here has; a *profile* prices the
machine at hand: ``runners.profile_engine`` times the torch engine's generation
iterations and PRM batches over a grid and this module fits, per kind of work, a small
non-negative linear model over the features the roofline itself uses:

* generation iteration: 1, decode rows, decode context tokens (KV read), prefill tokens,
  prefill attention pairs (query x key), rows that need logits (LM head);
* PRM batch: 1, tasks, new tokens, new x cached tokens (KV read), new-token pairs.

Non-negative least squares (``scipy.optimize.nnls``) keeps every coefficient a cost, so
a fitted model never predicts negative time. A query outside the measured range of any
feature is *extrapolated*: still predicted by the same line, and counted
(``ProfiledCostModel.extrapolated`` -> the summary's ``cost_model_extrapolated``), so a
result that leans on extrapolation says so. Memory capacity still comes from the
roofline dimensions of the models and the profile's memory size.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from specscale.engine.sim.cost_model import CostModel

GEN_FEATURES = ("intercept", "decode_rows", "decode_ctx_tokens", "prefill_tokens", "prefill_pairs", "logit_rows")
PRM_FEATURES = ("intercept", "tasks", "new_tokens", "new_x_cached", "new_pairs")


def gen_features(decode_ctx_lens: Sequence[int] | np.ndarray, prefill_chunks: Sequence[tuple[int, int]],
                 n_logit_rows: int) -> np.ndarray:
    tokens = pairs = 0
    for n_new, cached in prefill_chunks:
        tokens += n_new
        pairs += n_new * cached + n_new * (n_new + 1) // 2
    ctx = np.asarray(decode_ctx_lens, dtype=np.int64)
    return np.array([1.0, len(ctx), float(ctx.sum()), tokens, pairs, n_logit_rows], dtype=float)


def prm_features(tasks: Sequence[tuple[int, int]]) -> np.ndarray:
    new = cross = pairs = 0
    for n_new, cached in tasks:
        new += n_new
        cross += n_new * cached
        pairs += n_new * (n_new + 1) // 2
    return np.array([1.0, len(tasks), new, cross, pairs], dtype=float)


@dataclass(frozen=True)
class LinearCost:
    """seconds = coef . features, fitted by NNLS; lo/hi: the measured range of each feature."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]

    @classmethod
    def fit(cls, names: Sequence[str], X: np.ndarray, seconds: np.ndarray) -> "LinearCost":
        X, y = np.asarray(X, dtype=float), np.asarray(seconds, dtype=float)
        if X.ndim != 2 or X.shape[1] != len(names) or len(X) != len(y):
            raise ValueError(f"profile table: {X.shape} features for {len(names)} names and {len(y)} timings")
        if len(y) < len(names):
            raise ValueError(f"profile table: {len(y)} measurements cannot fit {len(names)} coefficients")
        # Scale columns so NNLS is well conditioned (features span 1 .. 1e8).
        scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
        coef, _ = nnls(X / scale, y)
        return cls(tuple(names), tuple(float(c) for c in coef / scale), tuple(float(v) for v in X.min(axis=0)),
                   tuple(float(v) for v in X.max(axis=0)))

    def predict(self, x: np.ndarray) -> tuple[float, bool]:
        """(seconds, extrapolated): outside the measured range of any feature (the
        intercept column is constant) counts as extrapolation."""
        outside = bool(np.any((x < np.asarray(self.lo) - 1e-9) | (x > np.asarray(self.hi) + 1e-9)))
        return float(np.dot(self.coef, x)), outside

    def as_dict(self) -> dict[str, Any]:
        return {"features": list(self.names), "coef": list(self.coef), "lo": list(self.lo), "hi": list(self.hi)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LinearCost":
        return cls(tuple(d["features"]), tuple(map(float, d["coef"])), tuple(map(float, d["lo"])),
                   tuple(map(float, d["hi"])))


@dataclass(frozen=True)
class CostProfile:
    """What ``runners.profile_engine`` measured on one device (see its docstring)."""

    device: str  # e.g. "NVIDIA H200" or "CPU: AMD EPYC 9B14 (2 threads)"
    generation: LinearCost
    prm: LinearCost
    host_iteration_s: float
    host_prm_task_s: float
    meta: Mapping[str, Any] = field(default_factory=dict)  # versions, threads, dtype, model pair, grid

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "generation": self.generation.as_dict(), "prm": self.prm.as_dict(),
                "host_iteration_s": self.host_iteration_s, "host_prm_task_s": self.host_prm_task_s,
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CostProfile":
        missing = {"device", "generation", "prm", "host_iteration_s", "host_prm_task_s"} - set(d)
        if missing:
            raise ValueError(f"hardware.profile: missing {sorted(missing)} (write it with runners.profile_engine)")
        return cls(str(d["device"]), LinearCost.from_dict(d["generation"]), LinearCost.from_dict(d["prm"]),
                   float(d["host_iteration_s"]), float(d["host_prm_task_s"]), dict(d.get("meta") or {}))

    def check_device(self, current: str) -> bool:
        """Warn (and return False) when predicting for a device other than the profiled one."""
        if current != self.device:
            warnings.warn(f"cost profile measured on {self.device!r} is used for {current!r}: its timings "
                          "describe the profiled device", stacklevel=2)
            return False
        return True


class ProfiledCostModel(CostModel):
    """The roofline model's memory accounting with timings predicted from a profile."""

    profile: CostProfile

    @classmethod
    def with_profile(cls, base: CostModel, profile: CostProfile) -> "ProfiledCostModel":
        model = cls.__new__(cls)
        model.__dict__.update(base.__dict__)
        model.profile = profile
        model.extrapolated = 0
        return model

    def host_costs(self) -> tuple[float, float]:
        """Measured host seconds per generation iteration and per PRM task."""
        return self.profile.host_iteration_s, self.profile.host_prm_task_s

    def generation_seconds(self, decode_ctx_lens, prefill_chunks, n_logit_rows: int) -> float:
        x = gen_features(decode_ctx_lens, prefill_chunks, n_logit_rows)
        if x[1] == 0 and x[3] == 0:
            return 0.0
        s, outside = self.profile.generation.predict(x)
        self.extrapolated += outside
        return s

    def prm_seconds_groups(self, groups: Sequence[tuple[int, float, float]]) -> float:
        """The profile has no closed form over groups: the tasks, one by one."""
        return self.prm_seconds([(n, c) for k, n, c in groups for _ in range(int(k))])

    def prm_seconds(self, tasks: Sequence[tuple[int, int]]) -> float:
        x = prm_features(tasks)
        if x[2] == 0:
            return 0.0
        s, outside = self.profile.prm.predict(x)
        self.extrapolated += outside
        return s


def cost_model_for(model_cfg: Mapping[str, Any], hardware_cfg: Mapping[str, Any], cost_cfg: Any,
                   **kw: Any) -> CostModel:
    """The roofline cost model, or a profiled one when the hardware config carries a
    ``profile`` (conf/hardware/profiled/<name>.yaml, written by runners.profile_engine)."""
    hw = dict(hardware_cfg)
    profile = hw.pop("profile", None)
    base = CostModel.from_configs(model_cfg, hw, cost_cfg, **kw)
    if profile is None:
        return base
    return ProfiledCostModel.with_profile(base, CostProfile.from_dict(profile))
