"""Where a cell's results live, and whether it is already done.

A cell directory reads as dataset/model/policy/b<beam>-c<concurrency>-s<seed>-<hash>,
under <results_dir>/<experiment_name>/. The hash covers the full resolved config minus
settings that cannot change a result (progress display, tracking, paths) and minus
policy switches the policy does not use (an `ep_cd` cell swept over `policy.b_max`
is one cell, run once), so a rerun of a sweep finds the cells it already finished.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from specscale.settings.search_policy import ConfigError
from specscale.metrics.writer import write_json
from specscale.settings import CellSpec

# Top-level settings that never change what a cell computes.
NON_SEMANTIC = ("progress", "wandb", "results_dir", "experiment_name", "hydra")


def canonical_policy(policy: Mapping[str, Any]) -> dict:
    """The policy with switches its modes ignore set to None."""
    p = dict(policy)
    if p.get("verification") not in ("lazy", "adaptive"):
        for k in ("b_max", "d_max", "sibling_trigger", "age_cap_s"):
            p[k] = None
    elif p.get("verification") == "adaptive":  # keeps the sibling trigger and age cap only
        p["b_max"] = p["d_max"] = None
    if p.get("verification") != "lazy":
        # Algorithm 3's readings concern lazy verification only; left out (not None) so the
        # hashes of the other policies' cells stay what they were before these switches.
        for k in ("lv_volume", "lv_sibling_flush", "lv_deferral"):
            p.pop(k, None)
    if p.get("speculation") == "none":
        p["depth"] = None
    return p


def canonical_config(spec: CellSpec) -> dict:
    """What a cell's result depends on: the config, the results version (grader and
    metric code) and the content of local data files (the spec's provenance part)."""
    out = {k: v for k, v in spec.resolved().items() if k not in NON_SEMANTIC}
    out["policy"] = canonical_policy(out["policy"])
    # The search kind (conf/search/): beam, the search from before the setting existed, is left
    # out so beam cells keep their hashes (and stay done); the REBASE temperature only where used.
    if "search" in out:
        search = dict(out["search"])
        if search.get("kind", "beam") == "beam":
            search.pop("kind", None)
        if search.get("kind") != "rebase":
            search.pop("rebase_temperature", None)
        out["search"] = search
    # The profile speed check only warns; rescaling off is the behaviour from before the
    # switch existed. Left out so those cells keep their hashes (and stay done).
    eng = {k: v for k, v in (out.get("engine") or {}).items() if k != "probe_check"}
    if not eng.get("rescale_to_probe"):
        eng.pop("rescale_to_probe", None)
    out["engine"] = eng
    out["results_version"] = spec.provenance.results_version
    if spec.provenance.source_fingerprint is not None:
        out["dataset"] = {**out["dataset"], "source_fingerprint": spec.provenance.source_fingerprint}
    return out


def _sha(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def config_hash(spec: CellSpec) -> str:
    return _sha(canonical_config(spec))


def context_hash(spec: CellSpec) -> str:
    """Hash of everything but the policy and the seed: cells that share it are the
    same experimental condition, comparable across policies and pairable by seed."""
    return _sha({k: v for k, v in canonical_config(spec).items() if k not in ("policy", "seed")})


# Settings that analysis sweeps along as named summary fields (policy, seed, beam, ...).
_SWEPT = ("policy", "seed", "beam", "expansion", "concurrency", "n_problems", "workload")


def settings_hash(spec: CellSpec) -> str:
    """Hash of every setting that is NOT a named summary field (engine internals, the
    synthetic workload, token caps, model and hardware details, ...): analysis keeps
    cells with different values apart even though no column names the difference."""
    ctx = {k: v for k, v in canonical_config(spec).items() if k not in _SWEPT}
    ctx["search"] = {k: v for k, v in ctx.get("search", {}).items() if k not in ("temperature", "max_rounds")}
    return _sha(ctx)


def experiment_root(spec: CellSpec) -> Path:
    return Path(spec.store.results_dir).expanduser() / str(spec.store.experiment)


def cell_name(spec: CellSpec) -> str:
    return f"b{spec.search.beam}-c{spec.concurrency}-s{spec.seed}-{config_hash(spec)}"


def cell_dir(spec: CellSpec) -> Path:
    return (experiment_root(spec) / spec.dataset.name / spec.model.name / str(spec.policy.name)
            / cell_name(spec))


def is_done(directory: Path) -> bool:
    """A summary is written last and atomically: its presence means a complete cell."""
    return (Path(directory) / "summary.json").is_file()


def ensure_writable(directory: Path) -> None:
    """Fail early, before any compute, when results could not be saved."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # A unique name per probe: a shared fixed name raced between parallel cells (one
        # process removed the probe another was about to remove, a false "not writable").
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".write_probe.", suffix=f".{os.getpid()}")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"results directory {directory} is not writable ({exc}); set results_dir=...") from exc


def clean_leftovers(directory: Path) -> list[Path]:
    """Remove temporary files a killed writer left (atomic_write's ``.NAME.*.tmp``, write
    probes). Called by the lock holder only: nobody else writes in the cell meanwhile."""
    removed = []
    for pattern in (".*.tmp", ".write_probe.*"):
        for path in Path(directory).glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def record_attempt(directory: Path, status: str, **fields: Any) -> None:
    """Append one line per attempt (start, and its end) to attempts.jsonl: an audit of who
    ran the cell, where and how it ended (a cell ran once iff it has one "start" line)."""
    line = json.dumps({"status": status, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
                       **fields}, default=str)
    with open(Path(directory) / "attempts.jsonl", "a") as fh:  # O_APPEND: one line per write
        fh.write(line + "\n")


def record_error(directory: Path, exc: BaseException, spec: CellSpec, status: str = "failed") -> Path:
    """Leave a record of a failed (or interrupted) cell; a later rerun retries it (no
    summary was written)."""
    path = Path(directory) / "error.json"
    write_json(path, {
        "status": status,
        "error_type": type(exc).__name__,
        "error": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "experiment": spec.store.experiment,
        "config_hash": config_hash(spec),
        "pid": os.getpid(),
    })
    return path


def clear_error(directory: Path) -> None:
    path = Path(directory) / "error.json"
    if path.exists():
        path.unlink()
