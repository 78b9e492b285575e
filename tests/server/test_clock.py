"""The sim's virtual clock charges modelled host work as "other"; the clocks' rules."""
from __future__ import annotations

import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.metrics.summary import summarize
from specscale.clock import HostCostModel, VirtualClock, WallClock


def test_sim_other_time_is_the_modelled_host_work():
    cfg = compose_cfg("policy=full", "beam=4", "engine.cost.host_iteration_s=0.002", "engine.cost.host_prm_task_s=0.001")
    s = build_server(cfg)
    rec = s.run()
    out = summarize(rec, [60], 1)
    iters = sum(1 for it in rec.iterations if it["kind"] == "generate")
    tasks = sum(b["n_tasks"] for b in rec.verify_batches)
    assert out["time_other_s"] == pytest.approx(0.002 * iters + 0.001 * tasks, rel=1e-9)
    assert out["makespan_s"] == pytest.approx(
        out["time_generation_s"] + out["time_verification_s"] + out["time_idle_s"] + out["time_other_s"], rel=1e-9)


def test_no_host_model_no_other_time():
    cfg = compose_cfg("policy=spec", "beam=4", "engine.cost.host_iteration_s=0", "engine.cost.host_prm_task_s=0")
    out = summarize(build_server(cfg).run(), [60], 1)
    assert out["time_other_s"] == pytest.approx(0.0, abs=1e-9)


def test_clocks():
    v = VirtualClock(HostCostModel(0.5, 0.25))
    v.start()
    v.device(1.0)
    v.host_iteration()
    v.host_prm_tasks(2)
    v.skip(3.0)
    assert v.stop() == pytest.approx(5.0)
    w = WallClock()
    w.start()
    w.device(100.0)  # device time already elapsed on a wall clock: not added again
    w.skip(2.0)      # idle gaps are skipped, not slept
    assert 2.0 <= w.stop() < 3.0
    with pytest.raises(ValueError):
        HostCostModel(-1.0, 0.0)
