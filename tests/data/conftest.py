"""Shared helpers for the data tests: a private datasets cache and config builders."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "dataset"


@pytest.fixture(scope="session")
def datasets_cache(tmp_path_factory) -> str:
    """A cache dir of our own, so tests neither read nor fill ~/.cache/huggingface."""
    return str(tmp_path_factory.mktemp("hf_datasets_cache"))


@pytest.fixture
def dataset_cfg(datasets_cache):
    """Load conf/dataset/<name>.yaml as a DictConfig, with overrides and the private cache."""

    def make(name: str, **overrides):
        cfg = OmegaConf.load(CONF_DIR / f"{name}.yaml")
        cfg = OmegaConf.merge(cfg, {"cache_dir": datasets_cache}, overrides)
        return cfg

    return make
