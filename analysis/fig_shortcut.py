"""Shortcut divergence: what the perfect-score shortcut changes (docs/paper.md §4.3, §12.1).

Strict pruning provably keeps the search tree; the shortcut may pick different parents
among tied perfect scores. Each shortcut policy (ep, ep_cd, full) is compared round by
round with `ep_strict` of the same context and seed (the harness's
`shortcut_divergence`): how many rounds the shortcut closed, how many of those changed
the selection, how many requests then diverged, and how many final answers changed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import read_cell_table
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, grouped_bars, note_omitted, panel_grid
from specscale.metrics.shortcut import shortcut_divergence

SHORTCUT_POLICIES = ("ep", "ep_cd", "full")
STRICT = "ep_strict"
FRACTIONS = ("shortcut_round_fraction", "selection_differs_fraction", "requests_diverged_fraction",
             "answers_changed_fraction")


def pair_counts(shortcut_dir, strict_dir) -> dict | None:
    """Counts for one (shortcut cell, strict cell) pair; None if a table is missing."""
    ra, rb = read_cell_table(shortcut_dir, "rounds"), read_cell_table(strict_dir, "rounds")
    qa, qb = read_cell_table(shortcut_dir, "requests"), read_cell_table(strict_dir, "requests")
    if any(t is None for t in (ra, rb, qa, qb)) or not len(ra):
        return None
    div = shortcut_divergence(ra, rb)
    diverged = div.loc[div["selection_differs"] | ~div["same_members"], "request_id"].nunique()
    ans = qa.merge(qb, on="request_id", suffixes=("_a", "_b"))
    changed = int((ans["answer_a"].astype(str) != ans["answer_b"].astype(str)).sum())
    acc = lambda q: float(q["correct"].dropna().astype(bool).mean()) if q["correct"].notna().any() else np.nan  # noqa: E731
    return {"rounds": len(div), "shortcut_rounds": int((div["closed_by"] == "shortcut").sum()),
            "comparable_rounds": int(div["same_members"].sum()), "selection_differs": int(div["selection_differs"].sum()),
            "requests": int(qa["request_id"].nunique()), "requests_diverged": int(diverged),
            "answers_changed": changed, "accuracy_diff": acc(qa) - acc(qb)}


def divergence_table(cells: pd.DataFrame) -> pd.DataFrame:
    can = C.canonical(cells)
    keys = C.context_columns(can)
    strict = C.of_policy(can, STRICT)
    strict_dir = dict(zip(C.key_series(strict, keys + ["seed"]), strict["cell_dir"]))
    pairs = []
    for pol in SHORTCUT_POLICIES:
        a = C.of_policy(can, pol)
        if "policy_pruning" in a.columns:  # a strict-only variant has no shortcut to measure
            a = a[a["policy_pruning"].astype(str) == "shortcut"]
        for k, rec in zip(C.key_series(a, keys + ["seed"]), a.to_dict("records")):
            counts = pair_counts(rec["cell_dir"], strict_dir[k]) if k in strict_dir else None
            if counts is not None:
                pairs.append({**{kk: rec.get(kk) for kk in keys}, "policy": pol, **counts})
    if not pairs:
        return pd.DataFrame()
    rows = []
    for key, g in C.group_by(pd.DataFrame(pairs), keys + ["policy"]):
        s = g.sum(numeric_only=True)
        rows.append({**key, "vs": STRICT, "n_seeds": len(g), "rounds": int(s["rounds"]),
                     "shortcut_round_fraction": s["shortcut_rounds"] / max(s["rounds"], 1),
                     "selection_differs_fraction": s["selection_differs"] / max(s["comparable_rounds"], 1),
                     "requests_diverged_fraction": s["requests_diverged"] / max(s["requests"], 1),
                     "answers_changed_fraction": s["answers_changed"] / max(s["requests"], 1),
                     "accuracy_diff_pp": 100 * float(g["accuracy_diff"].mean())})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    keys = C.context_columns(table)
    groups, omitted = cap_panels(C.group_by(table, keys))
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups))
    for ax, (key, g) in zip(axes, groups):
        pols = C.ordered_policies(g["policy"])
        g = g.set_index("policy").loc[pols]
        series = [{"label": f.replace("_fraction", "").replace("_", " "), "values": g[f], "color": f"C{i}"}
                  for i, f in enumerate(FRACTIONS)]
        grouped_bars(ax, pols, series)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"fraction (vs {STRICT}, same seed)")
        ax.set_title(C.context_label(key, varying), fontsize=9)
        finish_legend(ax, fontsize=6, outside=True)
    fig.suptitle("Perfect-score shortcut vs strict pruning (same seeds)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, out: Path) -> Section:
    sec = Section("shortcut", "Shortcut divergence (shortcut policies vs ep_strict)")
    table = divergence_table(cells)
    if not len(table):
        present = set(C.canonical(cells)["policy"]) if len(cells) else set()
        why = "no ep_strict cells" if STRICT not in present else \
            "no ep / ep_cd / full cell shares a context and seed with an ep_strict cell"
        sec.missing.append(f"Shortcut divergence: {why}")
        return sec
    add_figure(sec, plot(table), out, "shortcut_divergence", cells, table)
    add_table(sec, table, out, "shortcut_divergence",
              "Rounds closed by the shortcut, selections changed (among rounds with equal members), "
              "requests diverged, answers changed; pooled over seeds")
    return sec
