"""Host time of a measured run, iteration by iteration, and the host model fitted to it.

On the wall clock (torch) every generation iteration and PRM batch is recorded with its
start time and its device-synchronised seconds, and the serving loop does nothing else:
so the gap from the end of one device call to the start of the next is the host work
that call caused (sampling bookkeeping, the search woken by finished steps, forks,
scheduling and building the next batch; for a PRM batch, scores handed back, rounds
closed, children started). Summed, the gaps are the run's "other" time.

``fit_host_model`` fits ``HostCostModel``'s terms to these gaps by non-negative least
squares over what each call did, so the sim charges host work that grows with rows,
draws and tasks as the engine pays it. Only runs without idle gaps (saturated arrivals)
are fitted: a skipped idle stretch would be read as host work.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from specscale.clock import HostCostModel

# HostCostModel term -> recorder iteration column (the intercepts have no column).
GEN_TERMS = {"iteration_s": None, "decode_row_s": "decode_rows", "prefill_token_s": "prefill_tokens",
             "draw_s": "logical_draws", "step_end_s": "steps_finished", "fork_s": "forks"}
PRM_TERMS = {"prm_batch_s": None, "prm_task_s": "prm_tasks", "prm_token_s": "prm_tokens"}


def host_gaps(iterations: Sequence[dict], makespan_s: float) -> pd.DataFrame:
    """The recorder's iterations in time order with ``gap_s``: wall seconds from the end of
    each device call to the start of the next (the last one: to the end of the run)."""
    df = pd.DataFrame(list(iterations))
    if df.empty:
        return df.assign(gap_s=[])
    df = df.sort_values("t_start", kind="stable").reset_index(drop=True)
    nxt = df["t_start"].shift(-1).fillna(makespan_s)
    df["gap_s"] = (nxt - df["t_start"] - df["seconds"]).clip(lower=0.0)
    return df


def _design(df: pd.DataFrame, terms: dict) -> np.ndarray:
    return np.column_stack([np.ones(len(df)) if col is None else df[col].to_numpy(dtype=float)
                            for col in terms.values()])


def _fit(df: pd.DataFrame, terms: dict) -> dict[str, float]:
    if len(df) < len(terms):
        raise ValueError(f"host model: {len(df)} calls cannot fit {len(terms)} terms; profile longer cells")
    X = _design(df, terms)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)  # counts span 1 .. 1e4: keep NNLS well conditioned
    coef, _ = nnls(X / scale, df["gap_s"].to_numpy(dtype=float))
    return {name: float(c) for name, c in zip(terms, coef / scale)}


def fit_host_model(gaps: pd.DataFrame) -> HostCostModel:
    """HostCostModel fitted to ``host_gaps`` rows of one or more runs (generate and verify)."""
    gen, ver = gaps[gaps["kind"] == "generate"], gaps[gaps["kind"] == "verify"]
    return HostCostModel(**_fit(gen, GEN_TERMS), **_fit(ver, PRM_TERMS))


def predict_host(model: HostCostModel, gaps: pd.DataFrame) -> pd.Series:
    """Each call's host seconds as ``model`` charges them (the sim's virtual clock does the same)."""
    out = pd.Series(0.0, index=gaps.index)
    for kind, terms in (("generate", GEN_TERMS), ("verify", PRM_TERMS)):
        rows = gaps["kind"] == kind
        if rows.any():
            out[rows] = _design(gaps[rows], terms) @ np.array([getattr(model, t) for t in terms])
    return out
