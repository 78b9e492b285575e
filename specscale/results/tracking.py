"""Weights & Biases: one run per cell, grouped by experiment (default: offline)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

MODES = ("disabled", "offline", "online")
MAX_SERIES_POINTS = 2000  # history points per run; the full series goes in as a table


def log_cell(cfg: Mapping[str, Any], summary: Mapping[str, Any], iterations: Sequence[dict], out_dir: Path) -> None:
    wb = cfg.get("wandb") or {}
    mode = wb.get("mode", "disabled")
    if mode not in MODES:
        from specscale.config import ConfigError

        raise ConfigError(f"wandb.mode must be one of {MODES}, got {mode!r}")
    if mode == "disabled":
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(
        project=wb.get("project") or "specscale", entity=wb.get("entity"), mode=mode,
        group=str(cfg.get("experiment_name")), name=str(Path(out_dir).relative_to(Path(out_dir).parents[3])),
        config={**{k: v for k, v in cfg.items() if k != "hydra"}, "provenance": summary.get("provenance")}, dir=str(out_dir), reinit="finish_previous",
        tags=[str(summary.get("policy")), str(summary.get("engine"))],
    )
    try:
        gen = [r for r in iterations if r["kind"] == "generate"]
        stride = max(1, len(gen) // MAX_SERIES_POINTS)
        for i, r in enumerate(gen[::stride]):
            run.log({"t_s": r["t_start"], "iteration_s": r["seconds"], "physical_rows": r["physical_rows"],
                     "logical_draws": r["logical_draws"], "kv_used_blocks": r["kv_used_blocks"],
                     "pending_verify": r["pending_verify"]}, step=i)
        cols = ["kind", "t_start", "seconds", "physical_rows", "logical_draws", "kv_used_blocks", "prm_tasks",
                "prm_tokens", "trigger"]
        run.log({"iterations": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in iterations])})
        run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None})
    finally:
        run.finish()
