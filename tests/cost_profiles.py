"""A cost profile fitted from a known analytic cost function (shared by the profile tests)."""
from __future__ import annotations

import itertools

import numpy as np

from specscale.clock import HostCostModel
from specscale.engine.cost_profile import GEN_FEATURES, PRM_FEATURES, CostProfile, LinearCost, gen_features, prm_features

# A known cost (seconds) per feature: launch, per row, per KV token read, per prefill token, per pair, per LM-head row.
GEN_TRUE = np.array([2e-3, 2e-5, 1e-8, 5e-9, 5e-6, 1e-10, 1e-6])
PRM_TRUE = np.array([8e-3, 1e-4, 4e-6, 3e-8, 2e-9, 1e-9, 5e-5, 1e-8, 1e-10])


def gen_grid():
    for rows, ctx, pre in itertools.product((1, 8, 64, 256), (128, 512, 2048), (0, 256, 1024)):
        yield [ctx] * rows, ([(pre, 0)] if pre else []), rows + (1 if pre else 0)
        if rows > 1:  # ragged: one long row, so padded and summed keys differ
            yield [ctx] * (rows - 1) + [4 * ctx], [], rows


def prm_grid():
    for tasks, new, cached in itertools.product((1, 4, 16, 64), (16, 64, 256), (0, 256, 1024)):
        yield [(new, cached)] * tasks
        if tasks > 1 and cached:  # ragged: one task with a 4x longer cached prefix
            yield [(new, cached)] * (tasks - 1) + [(new, 4 * cached)]


def analytic_profile(device: str = "CPU: test") -> CostProfile:
    gx = np.array([gen_features(*q) for q in gen_grid()])
    px = np.array([prm_features(t) for t in prm_grid()])
    return CostProfile(device, LinearCost.fit(GEN_FEATURES, gx, gx @ GEN_TRUE),
                       LinearCost.fit(PRM_FEATURES, px, px @ PRM_TRUE),
                       HostCostModel(1e-3, 2e-4, draw_s=2e-6))
