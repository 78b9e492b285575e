"""Where a result came from: code, packages, host, the device actually used, the data.

Recorded in every summary (``provenance``) and W&B run config, so a number in a table
can be traced to the commit, library versions, machine and dataset rows it came from.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from specscale.settings import CellSpec

PACKAGES = ("specscale", "torch", "transformers", "flashinfer-python", "datasets", "math-verify", "hydra-core",
            "numpy", "wandb")
SOURCE_DIR = Path(__file__).resolve().parents[2]  # the checkout (or site-packages for a wheel)


@functools.lru_cache(maxsize=None)
def git_state(directory: Path = SOURCE_DIR) -> dict:
    """{"commit", "dirty"} of the checkout the code runs from; nulls for an installed wheel."""
    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != directory.resolve():
        return {"commit": None, "dirty": None}  # not our checkout (e.g. site-packages inside some repo)
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": (git("rev-parse", "HEAD") or "").strip() or None,
            "dirty": None if status is None else bool(status.strip())}


@functools.lru_cache(maxsize=None)
def versions() -> dict:
    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    torch = sys.modules.get("torch")
    out["cuda"] = getattr(getattr(torch, "version", None), "cuda", None) if torch else None
    return out


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: Any = None) -> dict:
    """The device a cell's compute ran on: a CUDA device's name, memory and driver, or the CPU."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        driver = None
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.TimeoutExpired):
            pass
        return {"type": "cuda", "name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                "driver": driver, "index": dev.index if dev.index is not None else torch.cuda.current_device()}
    return {"type": "cpu", "name": cpu_model(), "cores": __import__("os").cpu_count()}


def rows_fingerprint(problems: Iterable[Any]) -> str:
    """sha256 over the rows a cell served (id, text, reference answer, in order)."""
    h = hashlib.sha256()
    for p in problems:
        row = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else {"repr": repr(p)}
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def collect(spec: "CellSpec", device: Any = None, problems: Iterable[Any] = (),
            attention: Optional[dict] = None) -> dict:
    """The provenance block: the spec's own part (results version, data-file
    fingerprint, as the hash saw them) and what only the run knows (code, host, device,
    the attention path each model ran (None where the engine has no such choice), the rows
    served)."""
    ds, problems = spec.dataset, list(problems)
    return {
        "results_version": spec.provenance.results_version,
        "git": git_state(),
        "versions": versions(),
        "host": socket.gethostname(),
        "device": device_info(device),
        "attention": attention,
        "dataset": {"name": ds.name, "hub_name": ds.hub_name, "revision": ds.revision,
                    "source_fingerprint": spec.provenance.source_fingerprint,
                    "rows_fingerprint": rows_fingerprint(problems), "rows": len(problems)},
        "argv": list(sys.argv),
    }
