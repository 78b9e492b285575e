"""Request arrival times: saturated (all at t=0) or Poisson (seeded)."""
from __future__ import annotations

import numpy as np


def arrival_times(n: int, kind: str, rate: float | None = None, seed: int = 0) -> list[float]:
    if n < 0:
        raise ValueError(f"number of requests must be >= 0, got {n}")
    if kind == "saturated":
        return [0.0] * n
    if kind == "poisson":
        if rate is None or not rate > 0:
            raise ValueError(f"workload=poisson needs a positive rate (req/s), got {rate}")
        gaps = np.random.default_rng([seed, 0x5EED]).exponential(1.0 / rate, size=n)
        return np.cumsum(gaps).tolist()
    raise ValueError(f"unknown workload kind {kind!r}: use saturated or poisson")
