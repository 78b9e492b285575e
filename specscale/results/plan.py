"""The jobs of a sweep and the state of their cells in a results store.

    specscale --dry-run -m +experiment=fig13_ablation results_dir=/scratch/runs
    specscale --dry-run --list -m +experiment=fig15_breakdown     # one line per job: state, overrides
    python -m specscale.results.plan -m policy=nonspec,full 'beam=range(4,12,4)'

Jobs are expanded exactly as Hydra's basic sweeper does (its override grammar: lists,
``range(...)``, quoted values, ``hydra.sweeper.params`` of an experiment, command-line
values winning), each job's config is composed and its cell looked up:
done (summary.json), failed / interrupted (error.json), running (a live lock), pending.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from specscale.resources import conf_dir

DONE, FAILED, INTERRUPTED, RUNNING, PENDING = "done", "failed", "interrupted", "running", "pending"


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    cell_dir: Path
    status: str
    experiment: str


def cell_status(directory: Path) -> str:
    import json

    from specscale.results.lock import LOCK_NAME, is_stale, read_owner

    directory = Path(directory)
    if (directory / "summary.json").is_file():
        return DONE
    owner = read_owner(directory / LOCK_NAME)
    if owner is not None and not is_stale(directory / LOCK_NAME, owner):
        return RUNNING
    error = directory / "error.json"
    if error.is_file():
        try:
            return json.loads(error.read_text()).get("status", FAILED)
        except ValueError:
            return FAILED
    return PENDING


def expand(params: Optional[dict], arguments: Sequence[str], grids: Sequence[dict] = (),
           parser: Optional[OverridesParser] = None) -> list[list[str]]:  # fmt: skip
    """One override list per job, as the sweeper (hydra_plugins/specscale_sweeper) builds
    them: Hydra's basic sweep of ``params`` and the command line, or, where ``grids`` (the
    experiment's ``hydra.sweeper.grids``) are given, the union of one such sweep per grid
    block (the block on top of ``params``, the command line on top of both; a job met in
    two blocks once)."""
    parser = parser or OverridesParser.create()
    base = [f"{k}={v}" for k, v in (params or {}).items()]
    jobs, seen = [], set()
    for block in [[f"{k}={v}" for k, v in grid.items()] for grid in grids] or [[]]:
        for job in BasicSweeper.split_arguments(parser.parse_overrides([*base, *block, *arguments]), None)[0]:
            key = tuple(sorted(job))
            if key not in seen:
                seen.add(key)
                jobs.append(job)
    return jobs


def sweeper_grids(hydra_cfg) -> list[dict]:
    """``hydra.sweeper.grids`` of a composed config with its Hydra node (empty where unset)."""
    grids = hydra_cfg.hydra.sweeper.get("grids")
    return [dict(g) for g in OmegaConf.to_container(grids)] if grids else []


def _cell_overrides(job: Iterable[str]) -> list[str]:
    # hydra.* and hydra/launcher=... change where and how a job runs, never its cell.
    return [o for o in job if not o.lstrip("+~").startswith("hydra")]


def plan(arguments: Sequence[str], conf: Optional[Path] = None, progress: bool = False) -> list[Job]:
    """Every job of ``run.py -m ARGUMENTS`` with its cell and that cell's status. Each job's
    config is composed (~0.1 s a job); ``progress`` shows a bar (stderr) once that takes
    longer than a second."""
    from tqdm.auto import tqdm

    from specscale.results.store import cell_dir
    from specscale.settings import CellSpec
    from specscale.settings.search_policy import RefusedPair

    parser = OverridesParser.create()
    fixed = [o.input_line for o in parser.parse_overrides(list(arguments)) if not o.is_sweep_override()]
    with initialize_config_dir(config_dir=str(conf or conf_dir()), version_base="1.3"):
        hydra_cfg = compose("config", fixed, return_hydra_config=True)
        params = OmegaConf.to_container(hydra_cfg.hydra.sweeper.params) if hydra_cfg.hydra.sweeper.get(
            "params") else {}
        jobs = []
        expanded = expand(params, arguments, sweeper_grids(hydra_cfg))
        for job in tqdm(expanded, desc="composing jobs", unit="job", delay=1.0, leave=False,
                        disable=not progress or None):  # None: no bar where stderr is not a terminal
            try:
                spec = CellSpec.from_config(OmegaConf.to_container(compose("config", _cell_overrides(job)),
                                                                   resolve=True))  # fmt: skip
            except RefusedPair:  # the sweep leaves such a search x policy job out, so does its plan
                continue
            out = cell_dir(spec)
            jobs.append(Job(tuple(job), out, cell_status(out), str(spec.store.experiment)))
    return jobs


def report(jobs: Sequence[Job], cells: bool = False) -> str:
    """Per experiment: its jobs, distinct cells and their states; with ``cells``, one line
    per job: its number, its cell's state and the overrides that set it apart (those every
    job shares are named once), and which earlier job's cell it shares, if any."""
    lines = []
    for experiment in sorted({j.experiment for j in jobs}):
        mine = [j for j in jobs if j.experiment == experiment]
        distinct = {j.cell_dir: j.status for j in mine}
        counts = Counter(distinct.values())
        summary = ", ".join(f"{counts[s]} {s}" for s in (DONE, PENDING, FAILED, INTERRUPTED, RUNNING) if counts[s])
        lines.append(f"{experiment}: {len(mine)} jobs, {len(distinct)} distinct cells: {summary}")
        if cells:
            lines += _job_lines(mine)
    return "\n".join(lines)


def _job_lines(jobs: Sequence[Job]) -> list[str]:
    common = set.intersection(*(set(j.overrides) for j in jobs)) if len(jobs) > 1 else set()
    lines = [f"  every job: {' '.join(o for o in jobs[0].overrides if o in common)}"] if common else []
    first: dict[Path, int] = {}
    for number, job in enumerate(jobs, 1):
        own = " ".join(o for o in job.overrides if o not in common) or "(no overrides of its own)"
        shared = f"  (the cell of job {first[job.cell_dir]})" if job.cell_dir in first else ""
        first.setdefault(job.cell_dir, number)
        lines.append(f"  {number:{len(str(len(jobs)))}d} {job.status:11s} {own}{shared}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``specscale --dry-run [--list] -m OVERRIDES``: the sweep's job and cell counts by
    state; ``--list`` (or ``--cells``) adds one line per job."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-m", "--multirun", "--dry-run")]
    cells = "--cells" in args or "--list" in args
    args = [a for a in args if a not in ("--cells", "--list")]
    from specscale.settings.search_policy import ConfigError

    try:
        jobs = plan(args, progress=True)
    except ConfigError as exc:  # the sweep would refuse this cell before launching anything, too
        print(f"invalid cell: {exc}", file=sys.stderr)
        return 2
    print(report(jobs, cells=cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
