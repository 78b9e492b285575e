"""A profile that travels, or says it does not: the speed probes of hardware=profiled/<name>.

The profile records its probe times; a sim run on it times them again on this machine,
warns when they differ by more than 10%, and with engine.rescale_to_probe=true prices the
profile at this machine's speed (device terms by the device probe, host terms by the host
probe)."""
from __future__ import annotations

import warnings

import pytest
import yaml

from cfg_helpers import compose_cfg
from cost_profiles import analytic_profile
from specscale.cell import build_server
from specscale.compose import CONF_DIR
from specscale.engine.cost_profile import CostProfile, gen_features, prm_features
from specscale.engine.profile_speed import SpeedCheck, check_speed
from specscale.metrics.summary import summarize
from specscale.results.store import config_hash
from specscale.settings import CellSpec
from specscale.settings.search_policy import ConfigError

CELL = ("model=tiny", "engine=sim", "policy=nonspec", "beam=4", "concurrency=4", "n_problems=3", "seed=3",
        "workload=saturated")


def _run(hardware: dict, *extra: str) -> dict:
    cfg = compose_cfg(*CELL, *extra)
    cfg["hardware"] = hardware
    return summarize(build_server(cfg).run(), [60], 1)


def _shipped_profile(probe_scale: float = 1.0, host_scale: float = 1.0) -> dict:
    """conf/hardware/profiled/cpu-tiny.yaml with its recorded probe times scaled (doctored)."""
    hw = yaml.safe_load((CONF_DIR / "hardware" / "profiled" / "cpu-tiny.yaml").read_text())
    meta = hw["profile"]["meta"]
    meta["probe_s"] *= probe_scale
    if "host_probe_s" in meta:
        meta["host_probe_s"] *= host_scale
    return hw


def test_rescaling_multiplies_device_and_host_terms_by_their_factors():
    prof = analytic_profile()
    scaled = prof.rescaled(device=2.0, host=3.0)
    x, t = gen_features([256] * 8, [(64, 0)], 9), prm_features([(32, 128)] * 4)
    assert scaled.generation.predict(x)[0] == pytest.approx(2.0 * prof.generation.predict(x)[0], rel=1e-12)
    assert scaled.prm.predict(t)[0] == pytest.approx(2.0 * prof.prm.predict(t)[0], rel=1e-12)
    assert scaled.host.iteration_s == pytest.approx(3.0 * prof.host.iteration_s)
    assert scaled.host.draw_s == pytest.approx(3.0 * prof.host.draw_s)
    assert scaled.meta["rescaled_by"] == {"device": 2.0, "host": 3.0}
    assert CostProfile.from_dict(scaled.as_dict()) == scaled  # it travels as a profile file too
    with pytest.raises(ValueError, match="positive"):
        prof.rescaled(0.0, 1.0)


def test_a_profile_rescaled_by_a_known_factor_rescales_a_cells_prediction_by_it():
    hw = {"name": "profiled:test", "memory_gb": 80, "hbm_bandwidth_tb_s": 2.0, "bf16_tflops": 300,
          "profile": analytic_profile().as_dict()}
    slow = {**hw, "profile": analytic_profile().rescaled(2.5, 2.5).as_dict()}
    a, b = _run(hw), _run(slow)
    # Saturated arrivals: the schedule does not depend on time, so every second scales.
    for key in ("makespan_s", "time_generation_s", "time_verification_s", "time_other_s"):
        assert b[key] == pytest.approx(2.5 * a[key], rel=1e-9), key
    assert a["accuracy"] == b["accuracy"]


def test_the_probe_mismatch_warning_fires_on_a_doctored_profile():
    # The recorded probe made ten times faster than any machine runs it: this one is "slower".
    with pytest.warns(UserWarning, match=r"runs at a different speed now \(device probe [\d.]+x"):
        s = _run(_shipped_profile(probe_scale=0.1))
    assert s["profile_device_probe_ratio"] > 1.1 and s["profile_rescaled"] is False


def test_rescale_to_probe_prices_the_profile_at_this_machines_speed():
    doctored = _shipped_profile(probe_scale=0.1, host_scale=0.1)
    plain = _run(doctored, "engine.probe_check=false")
    assert "profile_device_probe_ratio" not in plain  # not checked: nothing recorded
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rescaled: no mismatch warning
        res = _run(doctored, "engine.rescale_to_probe=true")
    ratio = res["profile_device_probe_ratio"]
    assert res["profile_rescaled"] is True and ratio > 1.1
    # The schedule is the same; device seconds scale by the device ratio exactly.
    assert res["time_generation_s"] == pytest.approx(ratio * plain["time_generation_s"], rel=1e-9)
    assert res["time_verification_s"] == pytest.approx(ratio * plain["time_verification_s"], rel=1e-9)


def test_a_profile_without_probes_is_not_checked_and_cannot_be_rescaled():
    profile = analytic_profile().as_dict()
    assert check_speed(profile, rescale=False) is None
    with pytest.raises(ConfigError, match="records no speed probe"):
        check_speed(profile, rescale=True)
    with pytest.raises(ConfigError, match="needs a measured profile"):
        build_server(compose_cfg(*CELL, "hardware=a100", "engine.rescale_to_probe=true"))


def test_a_speed_check_without_a_device_probe_says_why_it_cannot_rescale():
    check = SpeedCheck(None, 1.3, True, "no CUDA device to probe")
    assert check.mismatches() == ["host probe 1.30x the profiled time"]
    with pytest.raises(ConfigError, match="no CUDA device"):
        check.factors()
    assert SpeedCheck(1.5, None, True).factors() == (1.5, 1.5)  # no host probe: host follows the device


def test_the_checks_leave_cell_hashes_alone_and_rescaling_is_a_different_cell():
    def h(*extra):
        return config_hash(CellSpec.from_config(compose_cfg(*CELL, "hardware=profiled/cpu-tiny", *extra)))

    assert h() == h("engine.probe_check=false") == h("engine.rescale_to_probe=false")
    assert h("engine.rescale_to_probe=true") != h()
