"""OmegaConf resolvers the configs use (registered when ``specscale`` is imported, so
every way of composing a config — run.py, Hydra's launchers' workers, ``compose_config``,
the planner — resolves them alike).

* ``${min:a,b}``: the smaller of two numbers, e.g. ``expansion: ${min:4,${beam}}`` in a
  sweep over budgets N = 1…64 that keeps M = 4 children per parent where N allows it.
"""
from __future__ import annotations

from omegaconf import OmegaConf


def register() -> None:
    if not OmegaConf.has_resolver("min"):
        OmegaConf.register_new_resolver("min", lambda a, b: min(a, b))
