"""Run the sim cells a set of targets needs, for given constants, and read predictions.

Cells run in worker processes (``jobs``), each composed from the project's config
with the target's overrides, the constants being fitted, ``n_problems`` and one of
``seeds``; results are cached per (cell, seed, constants), so a fit never runs the same
cell twice. A prediction is the mean over the seeds of each seed's measure of the
target (the protocol's seeds; one seed costs what a single run does).
Each summary gains derived fields the targets read: ``time_tokenization_s`` (the
modelled PRM input building inside "other": host_prm_task_s per PRM task),
``prm_rate_2048_over_8192`` (the PRM cost model's tokens/s at a 2,048-token batch
over that at 8,192: how saturated PRM throughput is at ~2k tokens) and
``sibling_common_token_share`` (``measure_sibling_overlap`` of the cell's synthetic
workload: the share of same-position tokens between siblings drawn from one history).
"""
from __future__ import annotations

import math
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from tqdm.auto import tqdm

from specscale.calibration.params import scoped
from specscale.calibration.targets import Cell, Summaries, Target, cells_of

# A PRM batch of 64-token tasks on 512 cached tokens, as nonspec's batches are.
_TASK = (64, 512)


def prm_saturation(cost: Any) -> float:
    rate = lambda tokens: tokens / cost.prm_seconds([_TASK] * (tokens // _TASK[0]))  # noqa: E731
    return rate(2048) / rate(8192)


def run_cell_summary(overrides: Sequence[str], measure_overlap: bool = False) -> dict[str, Any]:
    """One sim cell, in this process: its summary plus the derived fields (with
    ``measure_overlap``: the workload's share of common sibling tokens, ~1 s)."""
    from specscale.cell import build_server
    from specscale.compose import compose_config
    from specscale.metrics.summary import summarize

    cfg = compose_config([*overrides, "progress=false", "wandb.mode=disabled"], resolve=True)
    if cfg["engine"]["name"] != "sim":
        raise ValueError(f"calibration runs the simulator; got engine={cfg['engine']['name']}")
    server = build_server(cfg)
    rec = server.run()
    bs = server.blocks.block_size
    s = summarize(rec, cfg["metrics"]["latency_budgets_s"], server.backend.bytes_per_block(bs),
                  server.backend.prm_bytes_per_block(bs))
    tasks = sum(b["n_tasks"] for b in rec.verify_batches)
    cost = cfg["engine"]["cost"]
    charged = cost.get("host_prm_on_critical_path", True)
    s["time_tokenization_s"] = float(cost["host_prm_task_s"]) * tasks if charged else 0.0
    s["prm_rate_2048_over_8192"] = prm_saturation(server.backend.cost)
    if measure_overlap:
        from specscale.engine.synthetic.workload import measure_sibling_overlap

        s["sibling_common_token_share"] = measure_sibling_overlap(server.backend.workload, n_groups=60)
    return {k: v for k, v in s.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _measure(fn: Callable[[Summaries], float], s: Summaries) -> float:
    try:
        return float(fn(s))
    except (ZeroDivisionError, KeyError, ValueError):
        return math.nan


def seed_mean(values: Sequence[float]) -> float:
    """The mean of per-seed measures: nan if any seed's is undefined, inf if one is inf."""
    return sum(values) / len(values)


@dataclass
class Evaluator:
    """Predictions of targets under constants ``overrides`` (e.g. engine.cost.x=1.0)."""

    n_problems: int = 64
    seeds: tuple[int, ...] = (0,)
    jobs: int = 2
    base: tuple[str, ...] = ()  # overrides applied to every cell (e.g. a structural switch)
    measure_overlap: bool = False  # add sibling_common_token_share to every summary (~1 s per cell)
    progress: bool = False  # a bar over the cells of each batch (long validation runs)
    cache: dict[tuple[str, int, tuple[str, ...]], dict] = field(default_factory=dict)
    runs: int = 0
    _pool: Optional[ProcessPoolExecutor] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.seeds = tuple(int(x) for x in self.seeds)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one; got {self.seeds}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, todo: Sequence[tuple[Cell, int]], key: tuple[str, ...]) -> None:
        """Run the (cell, seed) pairs not cached yet, in the pool when there are several."""
        args = [[*c.overrides, *self.base, *self._applied(c, key), f"n_problems={self.n_problems}", f"seed={seed}"]
                for c, seed in todo]
        bar = tqdm(total=len(todo), desc="sim cells", unit="cell", disable=not self.progress, leave=False)
        if self.jobs > 1 and len(todo) > 1:
            if self._pool is None:  # spawned workers: no inherited torch / Hydra state, reused across calls
                self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"))
            futures = [self._pool.submit(run_cell_summary, a, self.measure_overlap) for a in args]
            for f in as_completed(futures):
                f.result()  # a failed cell stops here, with its traceback
                bar.update()
            results = [f.result() for f in futures]
        else:
            results = []
            for a in args:
                results.append(run_cell_summary(a, self.measure_overlap))
                bar.update()
        bar.close()
        for (c, seed), r in zip(todo, results):
            self.cache[(c.name, seed, self._applied(c, key))] = r
        self.runs += len(todo)

    @staticmethod
    def _applied(c: Cell, key: tuple[str, ...]) -> tuple[str, ...]:
        """The overrides that reach this cell: a pair's constant moves only its cells, so
        perturbing it reruns only them (the cache is keyed by what the cell saw)."""
        return tuple(scoped(key, c.overrides))

    def per_seed(self, cells: Iterable[Cell], overrides: Sequence[str] = (),
                 seeds: Optional[Sequence[int]] = None) -> dict[int, dict[str, dict]]:
        """{seed: {cell name: summary}} for ``seeds`` (default: all of this evaluator's)."""
        cells, key, seeds = list(cells), tuple(overrides), tuple(self.seeds if seeds is None else seeds)
        todo = [(c, seed) for seed in seeds for c in cells if (c.name, seed, self._applied(c, key)) not in self.cache]
        if todo:
            self._run(todo, key)
        return {seed: {c.name: self.cache[(c.name, seed, self._applied(c, key))] for c in cells} for seed in seeds}

    def summaries(self, cells: Iterable[Cell], overrides: Sequence[str] = (),
                  seed: Optional[int] = None) -> dict[str, dict]:
        """One seed's summaries (``seed`` may be left out when the evaluator has one)."""
        if seed is None:
            if len(self.seeds) != 1:
                raise ValueError(f"summaries of which seed? this evaluator has {self.seeds}")
            seed = self.seeds[0]
        return self.per_seed(cells, overrides, (seed,))[seed]

    def _mean_of(self, fns: Sequence[Optional[Callable[[Summaries], float]]], targets: Sequence[Target],
                 overrides: Sequence[str]) -> list[float]:
        by_seed = self.per_seed(cells_of(targets).values(), overrides)
        return [seed_mean([_measure(fn, s) for s in by_seed.values()]) if fn is not None else math.nan
                for fn in fns]

    def predict(self, targets: Sequence[Target], overrides: Sequence[str] = ()) -> list[float]:
        """Per target: the mean over the seeds of its measure of that seed's summaries."""
        return self._mean_of([t.measure for t in targets], targets, overrides)

    def beside(self, targets: Sequence[Target], overrides: Sequence[str] = ()) -> list[float]:
        """Per target: its reading reported beside the prediction (nan where it has none);
        from the cached summaries when predict has run."""
        return self._mean_of([t.beside for t in targets], targets, overrides)


def table(targets: Sequence[Target], predicted: Sequence[float],
          beside: Optional[Sequence[float]] = None) -> list[dict[str, Any]]:
    """Predicted vs paper per target, with the relative error and whether its rule holds
    (and, given ``beside``, the makespan ratio reported beside each throughput ratio)."""
    rows = []
    for i, (t, p) in enumerate(zip(targets, predicted)):
        rel = (p / t.value - 1.0) if t.value and p is not None and math.isfinite(p) else math.nan
        bound = {"rel": f"±{100 * t.tol:.0f}%", "range": f"in [{t.value:g}, {t.high or 0:g}]",
                 "below": f"< {t.value:g}", "above": f"> {t.value:g}"}[t.rule]
        row = {"id": t.id, "target": t.name, "paper": t.value if t.rule != "range" else f"{t.value:g}-{t.high:g}",
               "predicted": p, "unit": t.unit, "rel_error": rel, "rule": bound, "pass": t.passes(p)}
        if beside is not None:
            row["makespan_ratio"] = beside[i]
        rows.append({**row, "source": t.source})
    return rows


def overrides_of(values: Mapping[str, float]) -> list[str]:
    return [f"engine.{k}={v!r}" for k, v in values.items()]


