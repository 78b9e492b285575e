"""A cost profile: linear costs of the engine's work, fitted to measured timings.

Shared by the sim (``hardware=profiled/<name>``: sim/profiled.py prices a cell with it)
and by the vLLM replay (vllm/replay.py predicts vLLM's measured schedule with it).
How a profile is measured and why the fit is what it is: sim/profiled.py.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from specscale.clock import HostCostModel

GEN_FEATURES = ("intercept", "decode_rows", "decode_ctx_tokens", "decode_padded_keys", "prefill_tokens",
                "prefill_pairs", "logit_rows")
PRM_FEATURES = ("intercept", "tasks", "new_tokens", "cached_tokens", "new_x_cached", "new_pairs", "fresh_tasks",
                "padded_keys", "padded_pairs")


def gen_features(decode_ctx_lens: Sequence[int] | np.ndarray, prefill_chunks: Sequence[tuple[int, int]],
                 n_logit_rows: int) -> np.ndarray:
    tokens = pairs = 0
    for n_new, cached in prefill_chunks:
        tokens += n_new
        pairs += n_new * cached + n_new * (n_new + 1) // 2
    ctx = np.asarray(decode_ctx_lens, dtype=np.int64)
    # Decode rows' keys as a padded attention gathers them: every row to the longest context
    # (the torch backend); a ragged kernel (FlashInfer) reads decode_ctx_tokens instead.
    padded = float(len(ctx) * ctx.max()) if len(ctx) else 0.0
    return np.array([1.0, len(ctx), float(ctx.sum()), padded, tokens, pairs, n_logit_rows], dtype=float)


def prm_features(tasks: Sequence[tuple[int, int]]) -> np.ndarray:
    new = cached_total = cross = pairs = fresh = 0
    max_new = max_keys = 0
    for n_new, cached in tasks:
        new += n_new
        cached_total += cached
        cross += n_new * cached
        pairs += n_new * (n_new + 1) // 2
        if cached == 0:
            fresh += 1
        else:
            max_new, max_keys = max(max_new, n_new), max(max_keys, cached + n_new)
    # Tasks over a cached prefix attend as one padded group (queries to the longest new
    # piece, keys to the longest context); fresh tasks attend causally row by row.
    cached_tasks = len(tasks) - fresh
    return np.array([1.0, len(tasks), new, cached_total, cross, pairs, fresh, cached_tasks * max_keys,
                     cached_tasks * max_new * max_keys], dtype=float)


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
        if np.any(y <= 0):
            raise ValueError("profile table: every timing must be positive")
        # Relative error: divide each row by its timing (the fit then targets 1 everywhere);
        # scale columns so NNLS is well conditioned (features span 1 .. 1e8).
        Xw = X / y[:, None]
        scale = np.maximum(np.abs(Xw).max(axis=0), 1e-300)
        coef, _ = nnls(Xw / scale, np.ones_like(y))
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
    host: HostCostModel  # fitted to the gaps between device calls of profiling runs
    meta: Mapping[str, Any] = field(default_factory=dict)  # versions, threads, dtype, model pair, grid
    # Device seconds inside the serving loop over the micro-benchmarks' for the same batches
    # ("generation", "prm"), fitted on the profiler's serving cells (runners.profile_engine).
    in_loop: Mapping[str, float] = field(default_factory=lambda: {"generation": 1.0, "prm": 1.0})

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "generation": self.generation.as_dict(), "prm": self.prm.as_dict(),
                "host": asdict(self.host), "in_loop": dict(self.in_loop), "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CostProfile":
        missing = {"device", "generation", "prm", "host"} - set(d)
        if missing:
            raise ValueError(f"hardware.profile: missing {sorted(missing)} (write it with runners.profile_engine)")
        host = dict(d["host"])
        known = {f.name for f in fields(HostCostModel)}
        if set(host) - known:
            raise ValueError(f"hardware.profile.host: unknown terms {sorted(set(host) - known)}; known: {sorted(known)}")
        return cls(str(d["device"]), LinearCost.from_dict(d["generation"]), LinearCost.from_dict(d["prm"]),
                   HostCostModel(**{k: float(v) for k, v in host.items()}), dict(d.get("meta") or {}),
                   {"generation": 1.0, "prm": 1.0, **{k: float(v) for k, v in (d.get("in_loop") or {}).items()}})

    def rescaled(self, device: float, host: float) -> "CostProfile":
        """The profile on a machine ``device`` times slower in device work and ``host`` times
        slower in host work (probe seconds now over probe seconds when profiled): every
        device coefficient times ``device``, every host term times ``host``. The in-loop
        factors are ratios of device times and stay as they are."""
        if device <= 0 or host <= 0:
            raise ValueError(f"rescaling factors must be positive, got device={device}, host={host}")
        scale = lambda lin, f: replace(lin, coef=tuple(c * f for c in lin.coef))  # noqa: E731
        host_terms = {f.name: getattr(self.host, f.name) * host for f in fields(self.host)}
        return replace(self, generation=scale(self.generation, device), prm=scale(self.prm, device),
                       host=HostCostModel(**host_terms), meta={**self.meta, "rescaled_by": {"device": device, "host": host}})

    def check_device(self, current: str) -> bool:
        """Warn (and return False) when predicting for a device other than the profiled one."""
        if current != self.device:
            warnings.warn(f"cost profile measured on {self.device!r} is used for {current!r}: its timings "
                          "describe the profiled device", stacklevel=2)
            return False
        return True


