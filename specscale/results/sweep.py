"""What the sweeper does before and after launching (hydra_plugins/specscale_sweeper).

Before: every job's config is composed and validated (a bad cell stops the sweep before
anything is submitted), and done cells (or cells a live process holds) are dropped, so
a resubmitted 95%-done sweep asks SLURM for the remaining 5% only. Parallel launchers
get one sweep-level progress bar instead of a garbled bar per cell, and several torch
engines are refused on one GPU. After: the end-of-sweep counts come from the launcher's
returns, which reach this process under every launcher.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from specscale.settings.search_policy import ConfigError, RefusedPair

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
GPU_ENGINES = ("torch", "vllm")
LAST_COUNTS: Counter = Counter()  # the latest sweep's counts, for the SweepProgress callback
LAST_DIRS: list[Path] = []  # the latest sweep's cells, for its closing table


@dataclass
class PrePass:
    pending: list[list[str]] = field(default_factory=list)
    pending_dirs: list[Path] = field(default_factory=list)
    all_dirs: list[Path] = field(default_factory=list)  # every job's cell, done, running or pending
    counts: Counter = field(default_factory=Counter)  # skipped (done) / busy (running elsewhere) / refused
    refused: list[str] = field(default_factory=list)  # why each refused job means nothing (one line each)
    torch_gpu_jobs: Counter = field(default_factory=Counter)  # engine=torch jobs by engine.device (auto|cuda)


def report_refused(pre: PrePass, log) -> None:
    """Say which jobs a search x policy factorial left out; stop when nothing else is left."""
    if not pre.refused:
        return
    if not (pre.pending or pre.counts["skipped"] or pre.counts["busy"]):
        raise RefusedPair(pre.refused[0])
    log.info("[sweep] %d jobs left out: their search cannot run their policy (docs/design.md §2.1), e.g. %s",
             len(pre.refused), pre.refused[0])


def is_parallel(launcher_cfg: Mapping[str, Any]) -> bool:
    target = str(launcher_cfg.get("_target_", ""))
    if target == BASIC_LAUNCHER:
        return False
    return not (target.endswith("JoblibLauncher") and launcher_cfg.get("n_jobs") == 1)


def classify(job: Sequence[str], cfg: Mapping[str, Any], result: PrePass) -> None:
    from specscale.results.plan import DONE, RUNNING, cell_status
    from specscale.results.store import cell_dir
    from specscale.settings import CellSpec

    try:
        spec = CellSpec.from_config(cfg)  # a bad value stops the sweep before anything is launched
    except RefusedPair as exc:  # a search x policy factorial: the pairs that mean nothing are left out
        result.counts["refused"] += 1
        result.refused.append(f"{exc} (in the sweep's job {' '.join(job)})")
        return
    out = cell_dir(spec)
    result.all_dirs.append(out)
    status = cell_status(out)
    if status == DONE:
        result.counts["skipped"] += 1
    elif status == RUNNING:
        result.counts["busy"] += 1
    else:
        result.pending.append(list(job))
        result.pending_dirs.append(out)
        if spec.engine.name == "vllm":  # an install that fails every vLLM cell stops the sweep here (once)
            from specscale.settings.vllm_engine import check_vllm_imports

            check_vllm_imports()
        device = str(spec.config["engine"].get("device") or "auto")
        # Engines that size their memory from the GPU they see; cuda:N is a device of its own.
        if spec.engine.name in GPU_ENGINES and device in ("auto", "cuda"):
            result.torch_gpu_jobs[device] += 1


def check_gpu_sharing(launcher_cfg: Mapping[str, Any], pre: PrePass) -> None:
    """Two torch engines on one GPU each size their KV pool from the memory they see free,
    and then contend for it: refuse, before anything runs."""
    target = str(launcher_cfg.get("_target_", ""))
    n_jobs = launcher_cfg.get("n_jobs")
    if not target.endswith("JoblibLauncher") or n_jobs == 1:
        return
    on_gpu = pre.torch_gpu_jobs["cuda"]
    if pre.torch_gpu_jobs["auto"]:
        import torch

        on_gpu += pre.torch_gpu_jobs["auto"] if torch.cuda.is_available() else 0  # auto = cpu without CUDA
    if on_gpu >= 2:
        raise ConfigError(
            f"hydra/launcher=joblib with hydra.launcher.n_jobs={n_jobs} would run several engine=torch cells on one "
            "GPU, each sizing its KV pool to the memory it sees: use hydra.launcher.n_jobs=1, a launcher that gives "
            "each cell its own GPU (hydra/launcher=slurm_gpu, hydra/launcher=ray_gpu), or give each job its own "
            "engine.device=cuda:N (engine.device=cpu runs on the CPU)"
        )


class SweepBar:
    """One progress bar for the whole sweep, fed from the store (cells of parallel
    launchers run in other processes or on other nodes)."""

    def __init__(self, cell_dirs: Sequence[Path], interval_s: float = 2.0) -> None:
        from tqdm import tqdm

        self.dirs, self.interval = list(cell_dirs), interval_s
        self.bar = tqdm(total=len(self.dirs), desc="sweep", unit="cell")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _finished(self) -> int:
        return sum((d / "summary.json").is_file() or (d / "error.json").is_file() for d in self.dirs)

    def _poll(self) -> None:
        while not self.stop.wait(self.interval):
            self.bar.n = self._finished()
            self.bar.refresh()

    def __enter__(self) -> "SweepBar":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.bar.n = self._finished()
        self.bar.close()


def count_returns(returns: Sequence[Any], counts: Counter) -> None:
    from hydra.core.utils import JobStatus

    for r in returns:
        ok = r.status is JobStatus.COMPLETED and isinstance(r._return_value, dict)
        counts[r._return_value.get("status", "done") if ok else "failed"] += 1


def line(counts: Optional[Mapping[str, int]]) -> str:
    c = Counter(counts or {})
    text = f"{sum(c.values()) - c['refused']} cells: {c['done']} done, {c['skipped']} skipped, {c['failed']} failed"
    extra = [f"{c[k]} {k}" for k in ("busy", "interrupted") if c[k]]
    if c["refused"]:  # jobs, not cells: a search x policy pair that means nothing is never run
        extra.append(f"{c['refused']} search x policy jobs left out (refused pairs)")
    return text + (f", {', '.join(extra)}" if extra else "")
