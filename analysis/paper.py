"""The paper's reported numbers (results/paper/specscale_reported.csv) and lookups.

Rows are matched to our cells by model and dataset; a blank field in the reference
(the paper does not say, docs/paper.md) matches anything. Values keep the paper's units; the
figure modules convert (percent to fraction) where they compare.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import pandas as pd


REFERENCE_NAME = "specscale_reported.csv"  # in results/paper/ (specscale.resources.paper_csv)
COLUMNS = ("figure", "model", "dataset", "hardware", "policy", "baseline", "beam", "x_name", "x_value",
           "metric", "value", "value_high", "relation", "unit", "source", "quote")


def load_reference(path: Optional[Path] = None) -> pd.DataFrame:
    """The reference table (default: the paper's, results/paper/specscale_reported.csv).
    A missing file raises: a report without its paper columns must not pass silently."""
    from specscale.resources import MissingDataFile, paper_csv

    path = Path(path) if path else paper_csv()
    if not path.is_file():
        raise MissingDataFile(f"paper reference table {path} not found")
    df = pd.read_csv(path, dtype={"model": str, "dataset": str, "policy": str, "baseline": str, "x_name": str})
    for col in ("model", "dataset", "policy", "baseline", "x_name", "relation", "hardware"):
        df[col] = df[col].fillna("")
    return df


def rows(ref: pd.DataFrame, figure: str, metric: Optional[str] = None, **match: Any) -> pd.DataFrame:
    """Reference rows of a figure (and metric) matching the given fields. A blank
    reference model, dataset or beam (the paper does not say) matches any value;
    other fields must be equal."""
    out = ref[ref["figure"] == figure]
    if metric is not None:
        out = out[out["metric"] == metric]
    for key, val in match.items():
        missing = val is None or (isinstance(val, float) and math.isnan(val))
        if key in ("model", "dataset"):
            keep = out[key] == ""
            if not missing:
                keep |= out[key] == _norm_name(val)
        elif key in ("beam", "x_value"):
            ref_v = pd.to_numeric(out[key], errors="coerce")
            keep = ref_v.isna() if key == "beam" else pd.Series(False, index=out.index)
            if not missing:
                keep |= ref_v == float(val)
        else:
            keep = out[key].astype(str) == ("" if missing else str(val))
        out = out[keep]
    return out


def value(ref: pd.DataFrame, figure: str, metric: str, **match: Any) -> float:
    """The single matching value, NaN when none (or when only a bound is stated)."""
    r = rows(ref, figure, metric, **match)
    r = r[r["relation"].isin(["=", "~"])]
    return float(r["value"].iloc[0]) if len(r) else float("nan")


def models_of(ref: pd.DataFrame, figure: str) -> list[str]:
    return sorted({m for m in ref.loc[ref["figure"] == figure, "model"] if m})


def _norm_name(name: Any) -> str:
    """Fixture datasets are small local samples of the same benchmark: compare them
    with the benchmark's reported numbers (the table says which dataset was run)."""
    s = str(name)
    return s[len("fixture_"):] if s.startswith("fixture_") else s
