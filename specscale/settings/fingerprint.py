"""A fingerprint of a dataset's local source files, for the cell hash.

The hash must change when the data does, before anything runs (it names the cell
directory, and a done cell is skipped): an edited file at the same path would otherwise
count as done. Local files are hashed by content (cached per path, size and mtime, so a
sweep hashes each file once); a hub dataset is pinned by ``dataset.revision`` instead,
which is already part of the config.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.settings.dataset import resolve_data_files, resolve_local_path


@functools.lru_cache(maxsize=256)
def _file_sha(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(ds: Mapping[str, Any]) -> list[Path]:
    if ds.get("data_files") is not None:
        by_split = resolve_data_files(ds["data_files"], str(ds.get("split")))
        paths = [Path(f) for fs in by_split.values() for f in fs]
        import glob

        return [Path(m) for p in paths for m in (sorted(glob.glob(str(p))) or [str(p)])]
    if ds.get("data_dir") is not None:
        root = resolve_local_path(str(ds["data_dir"]))
        return sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts) if root.is_dir() else []
    return []


def source_fingerprint(ds: Mapping[str, Any]) -> Optional[str]:
    """sha256 (16 hex) over the local data files' names and contents; None for a hub
    dataset. A missing file is left to the loader, which names it."""
    files = _files(ds)
    if not files:
        return None
    h = hashlib.sha256()
    for path in files:
        try:
            st = path.stat()
        except OSError:
            h.update(f"{path.name}:missing".encode())
            continue
        h.update(f"{path.name}:{_file_sha(str(path), st.st_size, st.st_mtime_ns)}".encode())
    return h.hexdigest()[:16]
