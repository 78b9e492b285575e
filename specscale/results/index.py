"""The index: one row per cell of an experiment (or of a whole results tree)."""
from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import pandas as pd

from specscale.metrics.writer import atomic_write

INDEX_NAME = "index.parquet"


def _flat(value):
    """Parquet columns need scalars: nested values are kept as JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def read_cell(cell: Path, root: Optional[Path] = None) -> Optional[dict]:
    """One cell folder as a record: its summary with status "ok", or its error with status
    "failed" (a summary wins: a retried cell keeps its old error.json); None for neither.
    ``cell_dir`` is relative to root when given."""
    cell = Path(cell)
    rel = str(cell.relative_to(root)) if root is not None else str(cell)
    if (cell / "summary.json").is_file():
        return {**json.loads((cell / "summary.json").read_text()), "status": "ok", "cell_dir": rel}
    if (cell / "error.json").is_file():
        data = json.loads((cell / "error.json").read_text())
        return {"status": data.get("status", "failed"), "cell_dir": rel, "error": data.get("error"),
                "error_type": data.get("error_type"), "experiment": data.get("experiment")}
    return None


def cell_folders(root: Path) -> list[Path]:
    """Every cell folder below root that finished (summary.json) or failed (error.json)."""
    root = Path(root)
    return sorted({p.parent for p in root.rglob("summary.json")} | {p.parent for p in root.rglob("error.json")})


def collect(root: Path) -> pd.DataFrame:
    """Every finished (summary.json) or failed (error.json) cell below root."""
    root = Path(root)
    records = [r for r in (read_cell(d, root) for d in cell_folders(root)) if r is not None]
    return pd.DataFrame([{k: _flat(v) for k, v in r.items()} for r in records])


@contextmanager
def _locked(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".index.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # parallel cells (joblib) rebuild one at a time
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_index(root: Path) -> pd.DataFrame:
    """Rebuild root/index.parquet from the cells on disk (idempotent, atomic)."""
    root = Path(root)
    with _locked(root):
        # Holding the index lock: any index temp file is a killed writer's leftover.
        for leftover in root.glob(f".{INDEX_NAME}.*.tmp"):
            leftover.unlink(missing_ok=True)
        df = collect(root)
        atomic_write(root / INDEX_NAME, lambda tmp: df.to_parquet(tmp, index=False))
    return df


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Rebuild the results index of a directory")
    ap.add_argument("root")
    df = write_index(Path(ap.parse_args().root))
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    print(f"{len(df)} cells indexed: {counts}")


if __name__ == "__main__":
    main()
