"""The paper's experiments (conf/experiment/*.yaml): list them and enumerate their cells.

    python -m specscale.results.experiments            # every experiment with its cell count
    python -m specscale.results.experiments fig16_lv_threshold --cells
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Optional

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specscale.resources import conf_dir

CONF_DIR = conf_dir()  # the checkout's conf/, or the wheel's copy


def names(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml"))


def sweep_params(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """The experiment's swept settings after command-line overrides (as Hydra's basic sweeper reads them)."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return _sweep_params(name, list(overrides or []))


def _sweep_params(name: str, overrides: list[str]) -> dict[str, list[str]]:
    cfg = compose("config", [f"+experiment={name}", *overrides], return_hydra_config=True)
    params = {str(k): [v.strip() for v in str(val).split(",")] for k, val in cfg.hydra.sweeper.params.items()}
    for o in overrides:  # a command-line list sweeps too; a single value pins the setting
        key, _, val = o.partition("=")
        params[key.lstrip("+")] = [v.strip() for v in val.split(",")]
    return params


def cells(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR) -> list[list[str]]:
    """One override list per job of `python run.py -m +experiment=NAME [overrides]`."""
    return _product(sweep_params(name, overrides, conf_dir))


def _product(params: dict[str, list[str]]) -> list[list[str]]:
    keys = list(params)
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*(params[k] for k in keys))]


def distinct_cells(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR) -> set[str]:
    """Cell directories the jobs map to (jobs differing only in unused switches share one)."""
    from specscale.results.store import cell_dir

    out = set()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for job in _product(_sweep_params(name, list(overrides or []))):
            cfg = compose("config", [f"+experiment={name}", *job])
            out.add(str(cell_dir(OmegaConf.to_container(cfg, resolve=True))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="List the paper's experiments and their cells")
    ap.add_argument("name", nargs="?")
    ap.add_argument("--cells", action="store_true", help="print every job's overrides")
    args = ap.parse_args()
    found = names()
    if not found:
        raise SystemExit(f"no experiments in {CONF_DIR / 'experiment'}: the installation lacks its configs")
    for n in [args.name] if args.name else found:
        jobs = cells(n)
        print(f"{n:22s} {len(jobs):4d} jobs  {len(distinct_cells(n)):4d} distinct cells")
        if args.cells:
            for job in jobs:
                print("   ", " ".join(job))


if __name__ == "__main__":
    main()
