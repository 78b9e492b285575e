"""Speculative waste and losing-branch lifetime (docs/paper.md §3, §12.5).

Waste is tokens drawn for candidates that never finished their step as round members
(`wasted_tokens`, docs/design.md §5), shown relative to the logical tokens of the search so
policies and beams compare. The losing-branch lifetime (first token to cancellation) is
how long invalid work stays in flight (docs/paper.md §3): the cost early pruning attacks
and lazy verification trades against.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import cells as C
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, ci_errors, finish_legend, grouped_bars, note_omitted, panel_grid, policy_color

FIELDS = ("wasted_tokens", "logical_tokens", "losing_branch_lifetime_mean_s", "cancelled_candidates")


def waste_table(cells: pd.DataFrame) -> pd.DataFrame:
    can = C.canonical(C.saturated(cells))
    if not len(can) or not set(FIELDS) <= set(can.columns):
        return pd.DataFrame()
    can = can.assign(waste_per_logical_token=can["wasted_tokens"].astype(float) / can["logical_tokens"].clip(lower=1))
    keys = C.context_columns(can)
    rows = []
    for key, g in C.group_by(can, keys + ["policy"]):
        w = C.seed_summary(g["waste_per_logical_token"])
        life = C.seed_summary(g["losing_branch_lifetime_mean_s"])
        rows.append({**key, "n_seeds": w["n_seeds"], "wasted_tokens": float(g["wasted_tokens"].mean()),
                     "waste_per_logical_token": w["mean"], "waste_ci_low": w["ci_low"], "waste_ci_high": w["ci_high"],
                     "losing_branch_lifetime_mean_s": life["mean"], "lifetime_ci_low": life["ci_low"],
                     "lifetime_ci_high": life["ci_high"], "cancelled_candidates": float(g["cancelled_candidates"].mean())})
    out = pd.DataFrame(rows)
    return C.sort_rows(out, keys + ["policy"])


def plot(table: pd.DataFrame):
    """Two panels per context (beam on the x axis): waste per logical token, lifetime."""
    keys = C.context_columns(table, exclude=("beam",))
    groups, omitted = cap_panels(C.group_by(table, keys))
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(2 * len(groups), max_cols=2, width=6.0)
    for i, (key, g) in enumerate(groups):
        beams = sorted(g["beam"].unique())
        for ax, col, lo, hi, label in ((axes[2 * i], "waste_per_logical_token", "waste_ci_low", "waste_ci_high",
                                        "wasted / logical tokens"),
                                       (axes[2 * i + 1], "losing_branch_lifetime_mean_s", "lifetime_ci_low",
                                        "lifetime_ci_high", "losing-branch lifetime (s)")):
            series = []
            for pol in C.ordered_policies(g["policy"]):
                r = g[g["policy"] == pol].set_index("beam").reindex(beams)
                el, eh = ci_errors(r[col], r[lo], r[hi])
                series.append({"label": pol, "values": r[col], "err_low": el, "err_high": eh,
                               "color": policy_color(pol)})
            grouped_bars(ax, [f"beam {int(b)}" for b in beams], series)
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)  # a 2-seed t-interval can reach below zero; these cannot
            ax.set_title(C.context_label(key, varying), fontsize=9)
            finish_legend(ax, fontsize=6, outside=True)
    fig.suptitle("Speculative waste and losing-branch lifetime (saturated)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, out: Path) -> Section:
    sec = Section("waste", "Waste and losing-branch lifetime")
    table = waste_table(cells)
    if not len(table):
        sec.missing.append("Waste: no saturated canonical cells with " + ", ".join(FIELDS))
        return sec
    add_figure(sec, plot(table), out, "waste_lifetime", cells, table)
    add_table(sec, table, out, "waste_lifetime", "Wasted tokens per logical token and losing-branch lifetime")
    return sec
