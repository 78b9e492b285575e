"""Weights & Biases: one run per cell, grouped by experiment (default: offline).

The run id is derived from the experiment and the cell hash, and runs resume: a cell
killed after it started logging and rerun continues the same W&B run (``wandb sync``
uploads one run, not two). Per-iteration series are logged under ``iter/`` and kept out
of the run summary; nested summary values (``prm_triggers``, ``provenance``) are
flattened to ``a/b`` keys, which W&B shows as columns.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from specscale.settings import CellSpec

MAX_SERIES_POINTS = 2000  # history points per run; the full series goes in as a table
SERIES = ("t_start", "seconds", "physical_rows", "logical_draws", "kv_used_blocks", "pending_verify")


def run_id(experiment: Any, config_hash: Any) -> str:
    """Stable across reruns of one cell; W&B ids allow [a-z0-9] and a few more."""
    return hashlib.sha1(f"{experiment}/{config_hash}".encode()).hexdigest()[:20]


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, str, bool)) for x in v):
            out[key] = list(v)
    return out


def log_cell(spec: CellSpec, summary: Mapping[str, Any], iterations: Sequence[dict], out_dir: Path) -> None:
    wb = spec.tracking  # wandb.mode was checked with the rest of the spec
    if wb.mode == "disabled":
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    experiment = spec.store.experiment
    run = wandb.init(
        project=wb.project, entity=wb.entity, mode=wb.mode,
        id=run_id(experiment, summary.get("config_hash")), resume="allow",
        group=str(experiment), name=str(Path(out_dir).relative_to(Path(out_dir).parents[3])),
        config={**{k: v for k, v in spec.resolved().items() if k != "hydra"}, "provenance": summary.get("provenance")},
        dir=str(out_dir), reinit="finish_previous", tags=[str(summary.get("policy")), str(summary.get("engine"))],
    )
    try:
        run.define_metric("iter/step")
        run.define_metric("iter/*", step_metric="iter/step", summary="none")  # series, not results
        gen = [r for r in iterations if r["kind"] == "generate"]
        stride = max(1, len(gen) // MAX_SERIES_POINTS)
        for i, r in enumerate(gen[::stride]):
            run.log({"iter/step": i, **{f"iter/{k}": r[k] for k in SERIES}})
        cols = ["kind", "t_start", "seconds", "physical_rows", "logical_draws", "kv_used_blocks", "prm_tasks",
                "prm_tokens", "trigger"]
        run.log({"iterations": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in iterations])})
        run.summary.update(flatten(summary))
    finally:
        run.finish()
