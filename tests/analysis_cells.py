"""Hand-made analysis cells: one saturated Qwen2.5-7B / MATH-500 context (shared by analysis tests)."""
from __future__ import annotations

import pandas as pd

CTX = {"model": "qwen2.5-7b", "dataset": "math500", "engine": "sim", "hardware": "A100", "workload": "saturated",
       "rate": None, "expansion": 4, "concurrency": 32, "status": "ok", "variant": "", "cell_dir": "nowhere"}


def cells_of(rows) -> pd.DataFrame:
    return pd.DataFrame([{**CTX, **r} for r in rows])
