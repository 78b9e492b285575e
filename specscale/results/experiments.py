"""The paper's experiments (conf/experiment/*.yaml): list them and enumerate their cells.

    python -m specscale.results.experiments            # every experiment with its job count (seconds)
    python -m specscale.results.experiments fig16_lv_threshold --cells
    python -m specscale.results.experiments --distinct # and distinct cells: composes every job (minutes)

A job count is the product of the experiment's sweep lists (one config composed per
experiment); jobs that differ only in a switch their policy ignores share a cell, and
counting those distinct cells composes every job's config (~0.1 s a job), so it is opt-in.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from hydra import compose, initialize_config_dir

from specscale.resources import conf_dir

CONF_DIR = conf_dir()  # the checkout's conf/, or the wheel's copy


def names(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml"))


def sweep_params(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """The experiment's hydra.sweeper.params (Hydra override syntax, unexpanded)."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return _sweep(name, list(overrides or []))[0]


def _sweep(name: str, overrides: list[str]) -> tuple[dict[str, str], list[dict]]:
    """The experiment's hydra.sweeper.params and .grids (unexpanded)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from specscale.results.plan import sweeper_grids

    fixed = [o.input_line for o in OverridesParser.create().parse_overrides(overrides) if not o.is_sweep_override()]
    cfg = compose("config", [f"+experiment={name}", *fixed], return_hydra_config=True)
    return {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}, sweeper_grids(cfg)


def cells(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR) -> list[list[str]]:
    """One override list per job of `python run.py -m +experiment=NAME [overrides]`, expanded
    by Hydra's own override grammar (lists, range(...), quoting; command line wins)."""
    from specscale.results.plan import expand

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        params, grids = _sweep(name, list(overrides or []))
    return expand(params, list(overrides or []), grids)


def distinct_cells(name: str, overrides: Optional[list[str]] = None, conf_dir: Path = CONF_DIR,
                   progress: bool = False) -> set[str]:
    """Cell directories the jobs map to (jobs differing only in unused switches share one)."""
    from specscale.results.plan import plan

    return {str(j.cell_dir) for j in plan([f"+experiment={name}", *(overrides or [])], conf_dir, progress=progress)}


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="List the paper's experiments and their cells")
    ap.add_argument("name", nargs="?")
    ap.add_argument("--cells", action="store_true", help="print every job's overrides")
    ap.add_argument("--distinct", action="store_true",
                    help="also count distinct cells: composes every job's config (minutes for all experiments)")
    args = ap.parse_args(argv)
    found = names()
    if not found:
        raise SystemExit(f"no experiments in {CONF_DIR / 'experiment'}: the installation lacks its configs")
    if args.name and args.name not in found:
        raise SystemExit(f"no experiment {args.name!r} in {CONF_DIR / 'experiment'}; there are: {', '.join(found)}")
    for n in [args.name] if args.name else found:
        jobs = cells(n)
        line = f"{n:22s} {len(jobs):4d} jobs"
        if args.distinct:
            line += f"  {len(distinct_cells(n, progress=True)):4d} distinct cells"
        print(line, flush=True)  # as it goes: one composed config per experiment
        if args.cells:
            for job in jobs:
                print("   ", " ".join(job), flush=True)


if __name__ == "__main__":
    main()
