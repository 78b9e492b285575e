"""The profiled cost model: recovers a known cost function, flags extrapolation, names its device."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.engine.sim.cost_model import CostModel
from specscale.engine.cost_profile import GEN_FEATURES, CostProfile, LinearCost, gen_features, prm_features
from specscale.engine.sim.profiled import ProfiledCostModel
from cost_profiles import GEN_TRUE, PRM_TRUE, analytic_profile
from specscale.metrics.summary import summarize

fitted_profile = analytic_profile


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
    draws = sum(it["logical_draws"] for it in rec.iterations if it["kind"] == "generate")
    assert draws > 0  # the profile's per-draw host term is charged, draw by draw
    assert s["time_other_s"] == pytest.approx(
        1e-3 * iters + 2e-6 * draws + 2e-4 * sum(b["n_tasks"] for b in rec.verify_batches))


def test_an_iteration_of_prefill_alone_costs_what_the_profile_says():
    """The first wave of prompts, or sequences recomputed after preemption, run iterations
    with prefill rows and no decode row: they cost a forward, not nothing."""
    prof = fitted_profile()
    cfg = compose_cfg()
    model = ProfiledCostModel.with_profile(CostModel.from_configs(cfg["model"], cfg["hardware"], None), prof)
    want = prof.generation.predict(gen_features([], [(512, 0)], 1))[0] * prof.in_loop["generation"]
    assert want > 0 and model.generation_seconds(np.array([], dtype=np.int64), [(512, 0)], 1) == want
    assert model.generation_seconds(np.array([], dtype=np.int64), [], 0) == 0.0  # nothing to run
