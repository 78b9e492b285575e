"""Bad input gives a clear error, early."""
from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.settings.search_policy import ConfigError, PolicyConfig, SearchConfig


def test_beam_not_divisible_by_expansion():
    with pytest.raises(ConfigError, match="multiple of expansion"):
        build_server(compose_cfg("beam=6", "expansion=4"))


def test_unknown_policy():
    with pytest.raises((MissingConfigException, ConfigCompositionException), match="nope"):
        compose_cfg("policy=nope")


def test_concurrency_below_one():
    with pytest.raises(ConfigError, match="concurrency"):
        build_server(compose_cfg("concurrency=0"))


@pytest.mark.parametrize("setting", ["policy.b_max=0", "policy.d_max=-1", "policy.age_cap_s=0"])
def test_non_positive_lv_thresholds(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0].split(".")[1]):
        build_server(compose_cfg("policy=full", setting))


def test_poisson_needs_a_positive_rate():
    with pytest.raises(ConfigError, match="rate"):
        build_server(compose_cfg("workload=poisson", "workload.rate=0"))


def test_unknown_switch_values_and_settings():
    with pytest.raises(ConfigError, match="verification"):
        PolicyConfig(verification="sometimes")
    with pytest.raises(ConfigError, match="unknown setting"):
        PolicyConfig.from_config({"name": "x", "speculate": "naive"})
    with pytest.raises(ConfigError, match="score_agg"):
        SearchConfig(score_agg="mean")
    with pytest.raises(ConfigError, match="lookahead"):
        PolicyConfig(lookahead=True, speculation="naive")


def test_every_policy_composes_and_validates():
    for name in ["nonspec", "nonspec_cd", "spec", "ep_strict", "ep", "ep_cd", "full", "fasttts"]:
        cfg = compose_cfg(f"policy={name}")
        assert PolicyConfig.from_config(cfg["policy"]).name == name
