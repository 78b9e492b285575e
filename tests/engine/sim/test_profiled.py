"""The profiled cost model: recovers a known cost function, flags extrapolation, names its device."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.engine.sim.cost_model import CostModel
from specscale.engine.sim.profiled import (GEN_FEATURES, PRM_FEATURES, CostProfile, LinearCost, ProfiledCostModel,
                                           gen_features, prm_features)
from specscale.metrics.summary import summarize

# A known cost (seconds) per feature: launch, per row, per KV token read, per prefill token, per pair, per LM-head row.
GEN_TRUE = np.array([2e-3, 2e-5, 1e-8, 5e-6, 1e-10, 1e-6])
PRM_TRUE = np.array([8e-3, 1e-4, 4e-6, 2e-9, 1e-9])


def gen_grid():
    for rows, ctx, pre in itertools.product((1, 8, 64, 256), (128, 512, 2048), (0, 256, 1024)):
        dec = [ctx] * rows
        chunks = [(pre, 0)] if pre else []
        yield dec, chunks, rows + (1 if pre else 0)


def prm_grid():
    for tasks, new, cached in itertools.product((1, 4, 16, 64), (16, 64, 256), (0, 256, 1024)):
        yield [(new, cached)] * tasks


def fitted_profile(device="CPU: test") -> CostProfile:
    gx = np.array([gen_features(*q) for q in gen_grid()])
    px = np.array([prm_features(t) for t in prm_grid()])
    return CostProfile(device, LinearCost.fit(GEN_FEATURES, gx, gx @ GEN_TRUE),
                       LinearCost.fit(PRM_FEATURES, px, px @ PRM_TRUE), 1e-3, 2e-4)


def test_a_known_cost_function_is_recovered_inside_the_grid():
    prof = fitted_profile()
    rng = np.random.default_rng(0)
    for _ in range(50):  # random queries inside the grid's ranges, not on its points
        rows, ctx, pre = int(rng.integers(1, 257)), int(rng.integers(128, 2049)), int(rng.integers(0, 1025))
        x = gen_features([ctx] * rows, [(pre, 0)] if pre else [], rows)
        got, outside = prof.generation.predict(x)
        assert got == pytest.approx(float(x @ GEN_TRUE), rel=0.02) and not outside
        t = [(int(rng.integers(16, 257)), int(rng.integers(0, 1025)))] * int(rng.integers(1, 65))
        x = prm_features(t)
        got, outside = prof.prm.predict(x)
        assert got == pytest.approx(float(x @ PRM_TRUE), rel=0.02) and not outside


def test_a_memory_bound_roofline_is_recovered():
    """The roofline itself, profiled in its memory-bound decode regime (linear in rows and KV read)."""
    cfg = compose_cfg()
    base = CostModel.from_configs(cfg["model"], cfg["hardware"], cfg["engine"]["cost"])
    qs = [([ctx] * rows, [], rows) for rows, ctx in itertools.product((1, 4, 16, 32), (256, 1024, 4096))]
    x = np.array([gen_features(*q) for q in qs])
    y = np.array([base.generation_seconds(np.asarray(d), c, n) for d, c, n in qs])
    lin = LinearCost.fit(GEN_FEATURES, x, y)
    for (d, c, n), want in zip(qs, y):
        assert lin.predict(gen_features(d, c, n))[0] == pytest.approx(want, rel=0.02)


def test_outside_the_grid_is_flagged_and_counted():
    prof = fitted_profile()
    _, outside = prof.generation.predict(gen_features([512] * 1024, [], 1024))  # 1,024 rows > 256 profiled
    assert outside
    cfg = compose_cfg()
    model = ProfiledCostModel.with_profile(CostModel.from_configs(cfg["model"], cfg["hardware"], None), prof)
    model.generation_seconds(np.array([512] * 8), [], 8)
    assert model.extrapolated == 0
    model.prm_seconds([(4096, 0)])  # 4,096 new tokens > 256 profiled
    assert model.extrapolated == 1


def test_a_profile_names_its_device_and_warns_elsewhere():
    prof = CostProfile.from_dict(fitted_profile("NVIDIA H200").as_dict())
    assert prof.check_device("NVIDIA H200")
    with pytest.warns(UserWarning, match="measured on 'NVIDIA H200'"):
        assert not prof.check_device("CPU: somewhere")
    with pytest.raises(ValueError, match="missing"):
        CostProfile.from_dict({"device": "x"})


def test_the_sim_runs_on_a_profile():
    cfg = compose_cfg("policy=spec", "beam=4", "n_problems=4")
    cfg["hardware"]["profile"] = fitted_profile().as_dict()
    server = build_server(cfg)
    assert isinstance(server.backend.cost, ProfiledCostModel)
    rec = server.run()
    s = summarize(rec, [60], 1)
    assert isinstance(s["cost_model_extrapolated"], int)
    iters = sum(1 for it in rec.iterations if it["kind"] == "generate")
    assert s["time_other_s"] == pytest.approx(1e-3 * iters + 2e-4 * sum(b["n_tasks"] for b in rec.verify_batches))
