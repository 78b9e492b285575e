"""Load a results directory into pandas: one row per cell, and each cell's tables.

A results directory is any tree of cell directories. A sweep directory may carry an
`index.parquet` (one row per cell: the flattened summary, `cell_dir` relative to the
index, `status` ok|failed, `experiment`); where one is present it is the source of
truth for that subtree. Elsewhere the tree is scanned for `summary.json` (a complete
cell: the harness writes it last) and `error.json` (a failed cell). Cells a stale index
does not list yet are added by the same scan, so a sweep interrupted before its index
was rewritten is still read whole.

The analysis reads result files only; it imports nothing from the harness.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

INDEX_NAME = "index.parquet"
SUMMARY_NAME = "summary.json"
ERROR_NAME = "error.json"
CELL_TABLES = ("requests", "rounds", "verify_batches", "iterations")


def load_index(results_dir: Path | str) -> pd.DataFrame:
    """One row per cell below results_dir, `cell_dir` absolute, `status` ok|failed.

    Always returns a frame with at least the columns cell_dir, status, experiment,
    source (index|scan), error; an empty or missing directory gives zero rows."""
    root = Path(results_dir)
    rows = list(_collect(root)) if root.is_dir() else []
    df = pd.DataFrame(rows)
    for col in ("cell_dir", "status", "experiment", "source", "error"):
        if col not in df.columns:
            df[col] = pd.Series(dtype=object)
    df = _expand_json_columns(df)
    df.columns = [str(c).replace(".", "_") for c in df.columns]
    # Fields added to summaries later, with the value every older cell had: cells from
    # before and after them stay one context (pairable) rather than two.
    for col, before in (("search", "beam"), ("ablation", "none")):
        if col in df.columns:
            ok = df["status"] == "ok"
            df.loc[ok, col] = df.loc[ok, col].fillna(before)
    return df.reset_index(drop=True)


def ok_cells(index: pd.DataFrame) -> pd.DataFrame:
    return index[index["status"] == "ok"].reset_index(drop=True)


def failed_cells(index: pd.DataFrame) -> pd.DataFrame:
    return index[index["status"] != "ok"].reset_index(drop=True)


def read_cell_table(cell_dir: Path | str, name: str) -> Optional[pd.DataFrame]:
    """A cell's `<name>.parquet`, or None when the file is absent or unreadable (the
    caller reports the cell as missing data rather than failing)."""
    if name not in CELL_TABLES:
        raise ValueError(f"unknown cell table {name!r}; one of {CELL_TABLES}")
    path = Path(cell_dir) / f"{name}.parquet"
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except Exception:  # noqa: BLE001 - a truncated file is missing data, not a crash
        return None


def read_cell_tables(cells: pd.DataFrame, name: str) -> pd.DataFrame:
    """The named table of every cell, concatenated, with the cell's row index as `cell`.
    Cells without the file are skipped."""
    frames = []
    for i, cell_dir in cells["cell_dir"].items():
        df = read_cell_table(cell_dir, name)
        if df is not None and len(df):
            frames.append(df.assign(cell=i))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# --- collection -------------------------------------------------------------------

def _collect(directory: Path) -> Iterable[dict]:
    if (directory / INDEX_NAME).is_file():
        yield from _from_index(directory)
        return
    yield from _scan(directory)


def _scan(directory: Path, known: frozenset[str] = frozenset()) -> Iterable[dict]:
    """Cells below directory, descending until a cell or an index is found."""
    if str(directory.resolve()) in known:
        return
    if (directory / SUMMARY_NAME).is_file():
        row = _summary_row(directory)
        if row is not None:
            yield row
            return
    if (directory / ERROR_NAME).is_file():
        yield _error_row(directory)
        return
    for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (sub / INDEX_NAME).is_file():
            yield from _from_index(sub)
        else:
            yield from _scan(sub, known)


def _from_index(directory: Path) -> Iterable[dict]:
    try:
        idx = pd.read_parquet(directory / INDEX_NAME)
    except Exception:  # noqa: BLE001 - an unreadable index falls back to the scan
        yield from (r for sub in _subdirs(directory) for r in _scan(sub))
        return
    listed = set()
    for rec in idx.to_dict("records"):
        rel = rec.get("cell_dir")
        cell = (directory / str(rel)).resolve() if rel is not None else directory.resolve()
        listed.add(str(cell))
        rec = {k: _scalar(v) for k, v in rec.items()}
        rec["cell_dir"] = str(cell)
        rec["status"] = "ok" if rec.get("status") in (None, "ok", "done") else str(rec["status"])
        rec.setdefault("source", "index")
        rec["source"] = "index"
        yield rec
    # Cells written after the index was last rebuilt.
    for sub in _subdirs(directory):
        yield from _scan(sub, frozenset(listed))


def _subdirs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def _summary_row(cell: Path) -> Optional[dict]:
    try:
        summary = json.loads((cell / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    row = {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for k, v in summary.items()}
    row.update(cell_dir=str(cell.resolve()), status="ok", source="scan")
    row.setdefault("experiment", summary.get("experiment"))
    return row


def _error_row(cell: Path) -> dict:
    """A failed cell: its config (when config.json exists) says which cell is missing."""
    try:
        err = json.loads((cell / ERROR_NAME).read_text())
    except (OSError, ValueError):
        err = {}
    row: dict[str, Any] = {"cell_dir": str(cell.resolve()), "status": "failed", "source": "scan",
                           "error": err.get("error"), "error_type": err.get("error_type"),
                           "experiment": err.get("experiment")}
    row.update(_config_fields(cell))
    return row


def _config_fields(cell: Path) -> dict:
    try:
        cfg = json.loads((cell / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    get = lambda d, k: d.get(k) if isinstance(d, dict) else None  # noqa: E731
    out = {
        "policy": get(cfg.get("policy"), "name"), "model": get(cfg.get("model"), "name"),
        "dataset": get(cfg.get("dataset"), "name"), "workload": get(cfg.get("workload"), "kind"),
        "beam": cfg.get("beam"), "concurrency": cfg.get("concurrency"), "seed": cfg.get("seed"),
    }
    return {k: v for k, v in out.items() if v is not None}


def _scalar(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


def _expand_json_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Nested summary values (e.g. prm_triggers) are JSON text in an index and in our
    scan; expand dicts into `<column>_<key>` columns so every metric is a scalar."""
    for col in list(df.columns):
        if not (df[col].dtype == object or pd.api.types.is_string_dtype(df[col])):
            continue  # (pandas >= 3 reads text as the `str` dtype, not object)
        parsed = df[col].map(_json_dict)
        if parsed.isna().all():
            continue
        wide = pd.DataFrame([p if isinstance(p, dict) else {} for p in parsed], index=df.index)
        wide.columns = [f"{col}_{k}" for k in wide.columns]
        df = pd.concat([df.drop(columns=[col]), wide], axis=1)
    return df


def _json_dict(v: Any) -> Any:
    if isinstance(v, dict):
        return v
    if isinstance(v, str) and v.startswith("{"):
        try:
            d = json.loads(v)
        except ValueError:
            return None
        return d if isinstance(d, dict) else None
    return None
