"""Compose the project's Hydra config (conf/) outside ``run.py``: benchmarks, tests, tools."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from specscale.resources import conf_dir

CONF_DIR = conf_dir()  # the checkout's conf/, or the wheel's copy


def compose_config(overrides: Iterable[str] = (), resolve: bool = True, conf_dir: Path = CONF_DIR) -> dict:
    """The composed ``config`` with command-line style overrides, as a plain dict
    (without the ``hydra`` node), its interpolations resolved as ``run.py`` resolves them
    (e.g. the engine's row cap read from ``hardware.serving``). Callable inside a running
    Hydra app too (a cell of ``run.py`` that composes another config, e.g. the sim's
    profile speed check building the torch engine it probes): the app's Hydra is set
    aside while this one composes, and put back."""
    from hydra.core.global_hydra import GlobalHydra

    running = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    finally:
        if running is not None:
            GlobalHydra.instance().initialize(running)
    with open_dict(cfg):
        cfg.pop("hydra", None)  # its ${now:...} and ${hydra:...} need a running Hydra job
    return OmegaConf.to_container(cfg, resolve=resolve)
