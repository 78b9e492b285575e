"""The index: one row per cell of an experiment (or of a whole results tree)."""
from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from specscale.metrics.writer import atomic_write

INDEX_NAME = "index.parquet"


def _flat(value):
    """Parquet columns need scalars: nested values are kept as JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def collect(root: Path) -> pd.DataFrame:
    """Every finished (summary.json) or failed (error.json) cell below root."""
    root = Path(root)
    rows = []
    for summary in sorted(root.rglob("summary.json")):
        data = json.loads(summary.read_text())
        row = {k: _flat(v) for k, v in data.items()}
        row.update(status="ok", cell_dir=str(summary.parent.relative_to(root)))
        rows.append(row)
    done = {r["cell_dir"] for r in rows}
    for error in sorted(root.rglob("error.json")):
        rel = str(error.parent.relative_to(root))
        if rel in done:
            continue
        data = json.loads(error.read_text())
        rows.append({"status": data.get("status", "failed"), "cell_dir": rel, "error": data.get("error"),
                     "error_type": data.get("error_type"), "experiment": data.get("experiment")})
    return pd.DataFrame(rows)


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
