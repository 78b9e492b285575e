"""Paired comparisons of two policies on the same problems and seeds (docs/paper.md §10.1, §12.3).

Cells of one context and seed serve the same problems with the same logical samples
(docs/design.md §4), so their per-problem outcomes are paired: a McNemar test on the
discordant problems and a paired bootstrap of the accuracy difference use that pairing,
which an unpaired comparison of two accuracies (with their own Wilson intervals)
would throw away.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import read_cell_table
from analysis.stats import mcnemar_test, paired_bootstrap_diff


def graded_requests(cell_dir) -> pd.DataFrame:
    """problem_id, correct (bool), latency_s of a cell's graded requests; empty if none."""
    req = read_cell_table(cell_dir, "requests")
    if req is None or not len(req) or "correct" not in req.columns:
        return pd.DataFrame(columns=["problem_id", "correct", "latency_s"])
    req = req[req["correct"].notna()]
    return req.assign(correct=req["correct"].astype(bool))[["problem_id", "correct", "latency_s"]]


def paired_outcomes(a_cells: pd.DataFrame, b_cells: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """seed, problem_id, a, b: per-problem correctness of policy a and policy b, for every
    seed (and key) where both have a cell. Problems graded in only one are dropped."""
    keys = [k for k in keys if k in a_cells.columns and k in b_cells.columns]
    b_by_key = {k: row for k, row in zip(C.key_series(b_cells, keys), b_cells.to_dict("records"))}
    frames = []
    for k, row in zip(C.key_series(a_cells, keys), a_cells.to_dict("records")):
        other = b_by_key.get(k)
        if other is None:
            continue
        ra, rb = graded_requests(row["cell_dir"]), graded_requests(other["cell_dir"])
        m = ra.merge(rb, on="problem_id", suffixes=("_a", "_b"))
        frames.append(pd.DataFrame({"seed": row.get("seed"), "problem_id": m["problem_id"],
                                    "a": m["correct_a"].to_numpy(bool), "b": m["correct_b"].to_numpy(bool)}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["seed", "problem_id", "a", "b"])


def compare(outcomes: pd.DataFrame, seed: int = 0) -> dict:
    """Accuracy of a and b, their paired difference with a bootstrap interval, McNemar."""
    a, b = outcomes["a"].to_numpy(bool), outcomes["b"].to_numpy(bool)
    # Problems are the clusters: each is resampled with all its seeds (they share its difficulty).
    d = paired_bootstrap_diff(a.astype(float), b.astype(float), seed=seed,
                              clusters=outcomes["problem_id"].astype(str).to_numpy())
    m = mcnemar_test(a, b)
    return {"n_pairs": d.n, "n_seeds": int(outcomes["seed"].nunique()) if len(outcomes) else 0,
            "acc_a": d.mean_a, "acc_b": d.mean_b, "diff": d.diff, "diff_ci_low": d.ci_low,
            "diff_ci_high": d.ci_high, "only_a_correct": m.only_a, "only_b_correct": m.only_b,
            "mcnemar_p": m.pvalue if d.n else np.nan}
