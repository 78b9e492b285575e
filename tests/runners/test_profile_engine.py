"""runners.profile_engine on the tiny pair: a profile the sim loads and runs on."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from cfg_helpers import compose_cfg
from runners import profile_engine
from specscale.cell import build_server
from specscale.engine.sim.profiled import ProfiledCostModel



def test_profile_is_written_and_drives_the_sim(tmp_path, one_thread):
    conf, tab = tmp_path / "conf", tmp_path / "tab"
    assert profile_engine.main(["--name", "t", "--reps", "1", "--grid", "small", "--out-conf", str(conf), "--out-table", str(tab)]) == 0
    hw = yaml.safe_load((conf / "t.yaml").read_text())
    prof = hw["profile"]
    assert prof["device"].startswith("CPU") and prof["meta"]["model"] == "tiny" and prof["meta"]["grid"] == "small"
    assert all(c >= 0 for c in prof["generation"]["coef"] + prof["prm"]["coef"])
    # Host work and in-loop factors come from serving cells, run on both engines.
    assert prof["host"]["iteration_s"] + prof["host"]["prm_batch_s"] > 0
    assert all(v > 0 for v in prof["host"].values() if v) and set(prof["in_loop"]) == {"generation", "prm"}
    assert all(0.2 < v < 5 for v in prof["in_loop"].values()) and prof["meta"]["probe_s"] > 0
    # The speed reference: the probe's median over readings before, between and after the rounds.
    readings = prof["meta"]["probe_readings_s"]
    assert len(readings) == 2 and prof["meta"]["probe_s"] == pytest.approx(sum(readings) / 2, rel=1e-4)
    table = pd.read_parquet(tab / "t.parquet")
    assert {"decode", "prefill", "prm", "host"} <= set(table["kind"])
    assert (table["median_s"] > 0).all() and table["device"].nunique() == 1
    cfg = compose_cfg("policy=ep", "beam=4", "n_problems=3")
    cfg["hardware"] = hw
    server = build_server(cfg)
    assert isinstance(server.backend.cost, ProfiledCostModel)
    assert server.run().makespan_s > 0
