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
        log.info("[sweep] %s", self.line())

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from specscale.results.index import write_index

        for root in sorted(self.roots):
            df = write_index(Path(root))
            log.info("[sweep] index: %s (%d cells)", Path(root) / "index.parquet", len(df))
        print(f"[sweep] finished: {self.line()}")

    def line(self) -> str:
        c = self.counts
        line = f"{sum(c.values())} cells: {c['done']} done, {c['skipped']} skipped, {c['failed']} failed"
        return line + (f", {c['busy']} running in another sweep" if c["busy"] else "")
