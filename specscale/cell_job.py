"""Run one cell into the results store: skip if done, lock, record errors, track, index."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from specscale.cell import run_cell
from specscale.settings.search_policy import ConfigError
from specscale.results.index import write_index
from specscale.results.lock import CellBusy, CellLock
from specscale.results.signals import sigterm_as_interrupt
from specscale.settings import CellSpec, cell_spec
from specscale.results.store import (
    cell_dir, clean_leftovers, clear_error, config_hash, context_hash, ensure_writable, settings_hash,
    experiment_root, is_done, record_attempt, record_error,
)

log = logging.getLogger(__name__)

DONE, SKIPPED, FAILED, BUSY, INTERRUPTED = "done", "skipped", "failed", "busy", "interrupted"


def run_and_store(cell: CellSpec | Mapping[str, Any]) -> dict:
    """Run a cell (a spec, or a config this entry validates, once) into its store.

    Returns {"status": done|skipped|busy|failed, "cell_dir": ..., "summary": ... | None}.

    Configuration errors raise (a sweep with an impossible cell should stop early);
    any other failure is recorded in the cell's error.json and the sweep goes on. A cell
    another live process holds (a concurrent sweep on the same store) is left to it
    ("busy"). SIGINT / SIGTERM record the interruption, release the cell and propagate,
    so the sweep stops.
    """
    spec = cell_spec(cell)
    out = cell_dir(spec)
    # Done cells are skipped before any write, so a finished store can be read-only.
    if is_done(out):  # the index already lists it; a sweep's end rebuilds the index anyway
        log.info("skipped (already done): %s", out)
        return {"status": SKIPPED, "cell_dir": str(out), "summary": None}
    ensure_writable(out)
    try:
        lock = CellLock(out).acquire()
    except CellBusy as exc:
        log.info("skipped (%s)", exc)
        return {"status": BUSY, "cell_dir": str(out), "summary": None}
    try:
        with sigterm_as_interrupt():
            if is_done(out):  # finished by the previous holder while we waited for the lock
                return {"status": SKIPPED, "cell_dir": str(out), "summary": None}
            leftovers = clean_leftovers(out)
            record_attempt(out, "start", took_over=lock.took_over, leftovers=len(leftovers))
            summary, status = _run(spec, out)
            record_attempt(out, status)
    finally:
        lock.release()
    write_index(experiment_root(spec))
    return {"status": status, "cell_dir": str(out), "summary": summary}


def _run(spec: CellSpec, out) -> tuple[dict | None, str]:
    try:
        summary = run_cell(spec, out, progress=spec.progress,
                           extra={"experiment": spec.store.experiment, "config_hash": config_hash(spec),
                                  "context_hash": context_hash(spec), "settings_hash": settings_hash(spec)})
        clear_error(out)
        return summary, DONE
    except ConfigError:
        raise
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, SIGTERM (see signals.py), submitit requeue
        record_error(out, exc, spec, status=INTERRUPTED)
        record_attempt(out, INTERRUPTED, error=type(exc).__name__)
        log.warning("cell interrupted (%s); rerun the sweep to resume: %s", type(exc).__name__, out)
        raise
    except Exception as exc:  # noqa: BLE001 - a failing cell must not stop the sweep
        path = record_error(out, exc, spec)
        log.error("cell failed (%s: %s); error recorded in %s", type(exc).__name__, exc, path)
        return None, FAILED
