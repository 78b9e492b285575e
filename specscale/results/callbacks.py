"""Hydra callback: sweep-level progress (cells done / skipped / failed) and the index."""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("specscale.sweep")


class SweepProgress(Callback):
    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.roots: set[str] = set()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status is JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
            status = job_return.return_value.get("status", "done")
        else:
            status = "failed"
        self.counts[status] += 1
        try:
            self.roots.add(str(Path(config.results_dir).expanduser() / str(config.experiment_name)))
        except Exception:  # noqa: BLE001 - progress display must never fail a job
            pass
        # This process's jobs only (a joblib/submitit/ray worker sees its own): the sweep's
        # total is printed at the end, from the sweeper.
        cell = job_return.return_value.get("cell_dir") if status != "failed" else None
        log.info("[sweep] cell %s%s", status, f": {cell}" if cell else "")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from specscale.results.index import write_index

        for root in sorted(self.roots):
            df = write_index(Path(root))
            log.info("[sweep] index: %s (%d cells)", Path(root) / "index.parquet", len(df))
        from specscale.results import sweep

        # The sweeper's counts (from the launcher's returns) hold under every launcher; this
        # callback's own see only the jobs run in this process (all of them under basic).
        print(f"[sweep] finished: {sweep.line(sweep.LAST_COUNTS or self.counts)}")
        if sweep.LAST_DIRS:  # the sweep's cells, done now or before, and the failed ones
            from specscale.results import glance

            glance.render(glance.table(glance.read_cells(sweep.LAST_DIRS)), "the sweep's cells at a glance")
        sweep.LAST_COUNTS.clear()
        sweep.LAST_DIRS.clear()

    def line(self) -> str:
        from specscale.results.sweep import line

        return line(self.counts)
