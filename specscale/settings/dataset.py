"""The dataset config (``conf/dataset/*.yaml``) as a typed value.

Keys (all from the yaml, ``n_problems`` usually from the experiment):

    name          short name used in result paths and as ``Problem.source``
    hub_name      Hugging Face hub id (may be null when a local override is given)
    revision      hub revision (commit sha, tag or branch) given to load_dataset; null =
                  the default branch (record the resolved one: the summary's provenance)
    config_name   hub config ("main" for GSM8K, a subset name for OlympiadBench)
    split         split to read
    schema        column mapping: gsm8k | math500 | olympiadbench
    sample        int: draw this many problems with ``sample_seed`` (GSM8K: 1000)
    sample_seed   seed of that draw
    data_dir      local override: a directory (e.g. a downloaded snapshot of the hub
                  repo), passed to the same ``load_dataset`` call as its path
    data_files    local override: a json/jsonl/parquet/csv file, a list of them, or a
                  {split: files} mapping
    n_problems    optional: keep the first n problems after sampling
    cache_dir     optional: datasets cache directory
    sim           synthetic-workload parameters for engine=sim; not used here

Relative ``data_dir`` / ``data_files`` paths resolve against the data package first, then
the working directory (``resolve_local_path``).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# Relative local paths are looked up here first (specscale/data: the bundled fixtures).
DATA_PACKAGE_DIR = Path(__file__).resolve().parents[1] / "data"

SCHEMAS = ("gsm8k", "math500", "olympiadbench")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    schema: str
    split: str
    hub_name: str | None = None
    config_name: str | None = None
    revision: str | None = None
    sample: int | None = None
    sample_seed: int = 0
    data_dir: str | None = None
    data_files: Any = None  # str | list[str] | dict[str, str | list[str]] | None
    n_problems: int | None = None
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.schema not in SCHEMAS:
            raise ValueError(f"dataset.schema must be one of {SCHEMAS}, got {self.schema!r}")
        if self.hub_name is None and self.data_dir is None and self.data_files is None:
            raise ValueError(
                f"dataset {self.name!r} has no source: set dataset.hub_name, "
                "dataset.data_files=... or dataset.data_dir=..."
            )
        for key in ("sample", "n_problems"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"dataset.{key} must be a non-negative int or null, got {value!r}")

    @property
    def is_local(self) -> bool:
        """True when a local override replaces the hub."""
        return self.data_dir is not None or self.data_files is not None


def spec_from_config(cfg: Mapping[str, Any]) -> DatasetSpec:
    """Build a spec from a dict or an OmegaConf DictConfig (extra keys such as ``sim`` are ignored)."""
    plain = _to_plain_dict(cfg)
    missing = [k for k in ("name", "schema", "split") if plain.get(k) is None]
    if missing:
        raise ValueError(f"dataset config lacks required keys: {missing}")
    return DatasetSpec(
        name=str(plain["name"]),
        schema=str(plain["schema"]),
        split=str(plain["split"]),
        hub_name=plain.get("hub_name"),
        config_name=plain.get("config_name"),
        revision=None if plain.get("revision") is None else str(plain["revision"]),
        sample=plain.get("sample"),
        sample_seed=int(plain.get("sample_seed") or 0),
        data_dir=plain.get("data_dir"),
        data_files=plain.get("data_files"),
        n_problems=plain.get("n_problems"),
        cache_dir=plain.get("cache_dir"),
    )


def _to_plain_dict(cfg: Mapping[str, Any]) -> dict[str, Any]:
    # OmegaConf containers (ListConfig inside data_files, interpolations) become
    # plain Python values; datasets does not accept ListConfig as data_files.
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return dict(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # omegaconf is a dependency, but plain dicts need nothing
        pass
    return dict(cfg)


def resolve_local_path(path: str) -> Path:
    """Absolute path for a local override (the data package's directory first, for the
    bundled fixtures, then the current working directory)."""
    candidate = Path(os.path.expanduser(path))
    if candidate.is_absolute():
        return candidate
    in_package = DATA_PACKAGE_DIR / candidate
    if in_package.exists() or glob.glob(str(in_package)):
        return in_package
    return Path.cwd() / candidate


def resolve_data_files(data_files: Any, split: str) -> dict[str, list[str]]:
    by_split = data_files if isinstance(data_files, dict) else {split: data_files}
    resolved: dict[str, list[str]] = {}
    for split_name, files in by_split.items():
        listed = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        resolved[str(split_name)] = [str(resolve_local_path(str(f))) for f in listed]
    return resolved
