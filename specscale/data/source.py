"""Open one split of a dataset through ``datasets.load_dataset``, hub or local.

Every source goes through the same ``load_dataset(path, split=..., **kwargs)``
call, so tests on local fixture files exercise the path used for the hub:

- hub:        ``load_dataset(hub_name, name=config_name, split=split)``
- data_dir:   ``load_dataset(<local dir>, name=config_name, split=split)``; the dir
              is e.g. a snapshot of the hub repo made elsewhere with
              ``hf download <hub_name> --repo-type dataset --local-dir DIR``
              (its README declares the configs); for a plain folder of data files
              set ``dataset.config_name=null``.
- data_files: ``load_dataset("json" | "parquet" | "csv", data_files={split: [...]},
              split=split)``; the builder follows the file extension. Takes
              precedence over data_dir.

Relative local paths are looked up first under this package directory
(``specscale/data/``, where the bundled ``fixtures/`` live, so fixture configs work
from any working directory), then under the current working directory.

Offline mode: ``datasets`` and ``huggingface_hub`` read ``HF_HUB_OFFLINE`` /
``HF_DATASETS_OFFLINE`` once, at import. We read them again at call time, and when
they ask for offline mode the library flags are raised for the duration of the
call (and restored after), so a late ``export``/monkeypatch is honoured: only the
local cache is consulted and nothing waits on network retries.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from specscale.settings.dataset import DatasetSpec, resolve_data_files, resolve_local_path

PACKAGE_DIR = Path(__file__).resolve().parent
_TRUE = {"1", "ON", "YES", "TRUE"}
_COMPRESSION_SUFFIXES = {".gz", ".bz2", ".xz", ".zst", ".lz4"}
_BUILDER_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


class DatasetUnavailableError(RuntimeError):
    """The dataset could not be loaded (hub unreachable, offline and not cached, missing files)."""


def open_split(spec: DatasetSpec) -> Any:
    """Return the ``datasets.Dataset`` for ``spec.split``, or raise ``DatasetUnavailableError``."""
    path, kwargs = load_arguments(spec)
    from datasets import load_dataset  # heavy import, only when data is really read

    from specscale.data.check import check_columns, check_json_lines

    if path == "json":
        check_json_lines((f for fs in kwargs["data_files"].values() for f in fs), spec.schema)
    offline = offline_requested()
    try:
        with _library_offline_flags(offline):
            dataset = load_dataset(path, split=spec.split, **kwargs)
    except OSError as exc:  # ConnectionError, OfflineModeIsEnabled, FileNotFoundError, DatasetNotFoundError
        raise DatasetUnavailableError(unavailable_message(spec, exc, offline)) from exc
    where = ", ".join(f for fs in kwargs.get("data_files", {}).values() for f in fs) or f"dataset {path!r}"
    check_columns(dataset, spec.schema, f"{where} (split {spec.split!r})")
    return dataset


def load_arguments(spec: DatasetSpec) -> tuple[str, dict[str, Any]]:
    """The ``(path, kwargs)`` given to ``load_dataset`` (besides ``split``)."""
    kwargs: dict[str, Any] = {}
    if spec.cache_dir is not None:
        kwargs["cache_dir"] = str(spec.cache_dir)
    if spec.data_files is not None:
        files = resolve_data_files(spec.data_files, spec.split)
        kwargs["data_files"] = files
        return _builder_for(files), kwargs
    if spec.config_name is not None:
        kwargs["name"] = spec.config_name
    if spec.data_dir is not None:
        local_dir = resolve_local_path(str(spec.data_dir))
        if not local_dir.is_dir():
            # Checked here because datasets would read a missing "a/b" as a hub id.
            raise DatasetUnavailableError(
                f"dataset.data_dir={spec.data_dir!r} is not a directory (looked at {local_dir})."
            )
        return str(local_dir), kwargs
    assert spec.hub_name is not None  # DatasetSpec guarantees some source
    if spec.revision is not None:
        kwargs["revision"] = spec.revision
    return spec.hub_name, kwargs


def _builder_for(files: dict[str, list[str]]) -> str:
    first = next((f for fs in files.values() for f in fs), None)
    if first is None:
        raise ValueError("dataset.data_files is empty")
    suffixes = [s.lower() for s in Path(first).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        suffixes.pop()
    builder = _BUILDER_BY_SUFFIX.get(suffixes[-1] if suffixes else "")
    if builder is None:
        raise ValueError(
            f"cannot tell the format of {first!r}: use one of {sorted(_BUILDER_BY_SUFFIX)} files"
        )
    return builder


def offline_requested() -> bool:
    """HF offline mode as the environment says now (same precedence as ``datasets``)."""
    datasets_flag = os.environ.get("HF_DATASETS_OFFLINE")
    if datasets_flag is not None:
        env_offline = datasets_flag.upper() in _TRUE
    else:
        hub_flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
        env_offline = hub_flag.upper() in _TRUE
    if env_offline:
        return True
    import datasets.config

    return bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def _library_offline_flags(offline: bool) -> Iterator[None]:
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def unavailable_message(spec: DatasetSpec, exc: BaseException, offline: bool) -> str:
    """An error message that says what failed and which override to use instead."""
    reason = f"{type(exc).__name__}: {exc}".strip()
    if spec.is_local:
        where = f"the local files (data_files={spec.data_files!r}, data_dir={spec.data_dir!r})"
        hint = "Check the paths given in dataset.data_files=... / dataset.data_dir=... ."
    else:
        config = f", config {spec.config_name!r}" if spec.config_name else ""
        where = f"{spec.hub_name!r}{config} from the Hugging Face hub"
        mode = "HF offline mode is on and it is not in the local cache" if offline else "the hub could not be reached"
        hint = (
            f"{mode}. Load a local copy through the same loader instead: "
            f"dataset.data_files=/path/to/{spec.split}.jsonl (or .parquet/.csv, with the "
            f"{spec.schema!r} columns), or dataset.data_dir=/path/to/snapshot (e.g. from "
            f"`hf download {spec.hub_name} --repo-type dataset --local-dir DIR`); "
            f"for a smoke test use the bundled fixtures: dataset=fixture_{spec.schema}."
        )
    return f"Dataset {spec.name!r} (split {spec.split!r}) is unavailable: could not load {where}. {hint}\nCause: {reason}"
