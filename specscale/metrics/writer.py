"""Writes a cell's result files atomically (write to a temporary name, then rename)."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

RESULT_TABLES = ("requests", "rounds", "verify_batches", "iterations")


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it: set and restore at once
    os.umask(mask)
    return mask


def atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp makes the file 0600; a result file gets what any file the user writes
        # gets (0644 under the usual umask), so collaborators on a shared store can read it.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x


def write_json(path: Path, obj: dict) -> None:
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(_jsonable(obj), f, indent=2, sort_keys=True)

    atomic_write(path, w)


def write_tables(out_dir: Path, rec: Any) -> None:
    out_dir = Path(out_dir)
    for name in RESULT_TABLES:
        df = pd.DataFrame(getattr(rec, name))
        atomic_write(out_dir / f"{name}.parquet", lambda tmp, df=df: df.to_parquet(tmp, index=False))


def write_cell(out_dir: Path, rec: Any, summary: dict) -> None:
    """Tables first, summary last: a summary on disk means the cell is complete."""
    write_tables(out_dir, rec)
    write_json(Path(out_dir) / "summary.json", summary)
