"""Run one cell into the results store: skip if done, record errors, track, index."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from specscale.cell import run_cell, validate
from specscale.config import ConfigError
from specscale.results.index import write_index
from specscale.results.store import (
    cell_dir, clear_error, config_hash, context_hash, ensure_writable, settings_hash, experiment_root, is_done, record_error,
)

log = logging.getLogger(__name__)

DONE, SKIPPED, FAILED = "done", "skipped", "failed"


def run_and_store(cfg: Mapping[str, Any]) -> dict:
    """Returns {"status": done|skipped|failed, "cell_dir": ..., "summary": ... | None}.

    Configuration errors raise (a sweep with an impossible cell should stop early);
    any other failure is recorded in the cell's error.json and the sweep goes on.
    """
    validate(cfg)
    out = cell_dir(cfg)
    ensure_writable(out)
    if is_done(out):  # the index already lists it; a sweep's end rebuilds the index anyway
        log.info("skipped (already done): %s", out)
        return {"status": SKIPPED, "cell_dir": str(out), "summary": None}
    try:
        summary = run_cell(cfg, out, progress=bool(cfg.get("progress", False)),
                           extra={"experiment": cfg["experiment_name"], "config_hash": config_hash(cfg),
                                  "context_hash": context_hash(cfg), "settings_hash": settings_hash(cfg)})
        clear_error(out)
        status = DONE
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing cell must not stop the sweep
        path = record_error(out, exc, cfg)
        log.error("cell failed (%s: %s); error recorded in %s", type(exc).__name__, exc, path)
        summary, status = None, FAILED
    write_index(experiment_root(cfg))
    return {"status": status, "cell_dir": str(out), "summary": summary}
