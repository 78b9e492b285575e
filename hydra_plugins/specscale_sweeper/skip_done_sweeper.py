"""Hydra sweeper that skips done cells before launching (conf/hydra/sweeper/skip_done.yaml).

Hydra instantiates sweepers only from the ``hydra_plugins`` namespace; the work is in
specscale/results/sweep.py.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict
from tqdm.auto import tqdm

log = logging.getLogger("specscale.sweep")


class SkipDoneSweeper(BasicSweeper):
    """``grids`` (optional): a list of parameter blocks like ``params``; the sweep runs the
    union of their factorials (each block on top of ``params``, the command line on top of
    both; a job met in two blocks runs once). A partial design: e.g. every budget for one
    policy, and every policy at one budget, without the full product."""

    def __init__(self, max_batch_size: Optional[int], params: Optional[Dict[str, str]] = None,
                 grids: Optional[List[Dict[str, str]]] = None) -> None:  # fmt: skip
        super().__init__(max_batch_size, params)
        self.grids = list(grids or [])

    def sweep(self, arguments: List[str]) -> Any:
        from specscale.results import sweep as S
        from specscale.results.plan import expand
        from specscale.settings.search_policy import ConfigError, exit_on_config_error

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = expand(self.params, arguments, self.grids, parser)
        pre, tic = S.PrePass(), time.perf_counter()
        # Composing a job's config takes ~0.2 s: a large factorial needs a bar before launch.
        for job in tqdm(jobs, desc="[sweep] checking cells", unit="job", disable=len(jobs) < 50, leave=False):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
            with open_dict(cfg):
                del cfg["hydra"]
            try:
                S.classify(job, OmegaConf.to_container(cfg, resolve=True), pre)
            except ConfigError as exc:  # a bad value stops the sweep before anything runs
                exit_on_config_error(ConfigError(f"{exc} (in the sweep's job {' '.join(job)})"))
        try:
            S.report_refused(pre, log)
        except ConfigError as exc:  # every job of the sweep is a refused pair
            exit_on_config_error(exc)
        launcher_cfg = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
        S.check_gpu_sharing(launcher_cfg, pre)
        log.info("[sweep] %d jobs: %d to run, %d done, %d running in another sweep (checked in %.1f s)", len(jobs),
                 len(pre.pending), pre.counts["skipped"], pre.counts["busy"], time.perf_counter() - tic)
        parallel = S.is_parallel(launcher_cfg)
        pending = [[*job, "progress=false"] if parallel else job for job in pre.pending]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        counts, returns, index = pre.counts.copy(), [], 0  # refused jobs stay counted for the closing line
        self.overrides = list(self.split_overrides_to_chunks(pending, self.max_batch_size)) if pending else []
        bar = S.SweepBar(pre.pending_dirs) if parallel and pending else None
        try:
            if bar is not None:
                bar.__enter__()
            while not self.is_done():
                batch = self.get_job_batch()
                results = self.launcher.launch(batch, initial_job_idx=index)
                S.count_returns(results, counts)
                for r in results:
                    try:
                        _ = r.return_value  # re-raise a job's exception (a configuration error stops the sweep)
                    except ConfigError as exc:  # found while building a job's engine: one line, as above
                        exit_on_config_error(exc)
                index += len(batch)
                returns.append(results)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
            S.LAST_COUNTS.clear()
            S.LAST_COUNTS.update(counts)
            S.LAST_DIRS[:] = pre.all_dirs
        return returns
