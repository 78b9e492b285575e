"""Test helpers: compose the real Hydra config (conf/) with small, fast settings."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

# A small but complete search: short steps and paths so one cell runs in well under a second.
SMALL = [
    "n_problems=4",
    "concurrency=4",
    "search.max_rounds=8",
    "search.step_token_cap=48",
    "search.path_token_cap=240",
    "engine.synthetic.step_len_median=10",
    "engine.synthetic.steps_median=4",
    "dataset.sim.prompt_tokens_mean=24",
    "progress=false",
]


def compose_cfg(*overrides: str, small: bool = True) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*(SMALL if small else []), *overrides])
    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra", None)
    return out

