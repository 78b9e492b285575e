"""The data files the harness ships: Hydra configs (conf/), the paper's numbers and the
validation protocol.

In a checkout they are read where they live (the repository keeps its top-level
``conf/``, ``results/paper/`` and ``results/validation/``); a wheel carries copies as the
packages ``specscale._conf``, ``specscale._paper`` and ``specscale._validation`` (setup.py
maps them). A file that is in neither place is an error that says so, never an empty
result.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


class MissingDataFile(FileNotFoundError):
    """A file the installation should carry is absent."""


def _packaged(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _locate(checkout_dir: Path, package: str, probe: str) -> Path:
    for candidate in (checkout_dir, _packaged(package)):
        if candidate is not None and (candidate / probe).is_file():
            return candidate
    raise MissingDataFile(
        f"{probe} not found in {checkout_dir} (checkout) nor in the installed package {package}: "
        "reinstall specscale (pip install .) or run from the repository"
    )


def conf_dir() -> Path:
    """The directory holding config.yaml and the config groups."""
    return _locate(CHECKOUT / "conf", "specscale._conf", "config.yaml")


def paper_csv() -> Path:
    """results/paper/specscale_reported.csv: the paper's reported numbers."""
    return _locate(CHECKOUT / "results" / "paper", "specscale._paper", "specscale_reported.csv") / \
        "specscale_reported.csv"


def validation_protocol() -> Path:
    """results/validation/protocol.yaml: which paper numbers are fitted, developed on, sealed."""
    return _locate(CHECKOUT / "results" / "validation", "specscale._validation", "protocol.yaml") / "protocol.yaml"
