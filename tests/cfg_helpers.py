"""Test helpers: compose the real Hydra config (conf/) with small, fast settings."""
from __future__ import annotations

from specscale.compose import compose_config

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
    return compose_config([*(SMALL if small else []), *overrides])



def compose_spec(*overrides: str, small: bool = True):
    """The composed config, validated into the cell spec that entry points hand down."""
    from specscale.settings import CellSpec

    return CellSpec.from_config(compose_cfg(*overrides, small=small))
