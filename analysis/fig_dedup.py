"""Physical/logical ratio: how much decode work computation deduplication removes.

Per generation iteration, physical rows (forward passes, one per physical sequence)
over logical draws (one per logical candidate). Without CD the ratio is 1; with CD it
falls by the share of candidates whose token history coincides (docs/paper.md §5.3: the paper
measures 25-50% common tokens at temperature 0.8, an overlap, not this ratio). The
overall ratio is the summary's; the per-iteration spread comes from iterations.parquet.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import read_cell_table
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, grouped_bars, note_omitted, panel_grid, policy_color

RATIO = "physical_logical_ratio"


def iteration_ratios(cell_dir) -> np.ndarray:
    """physical_rows / logical_draws of each generation iteration that drew tokens."""
    it = read_cell_table(cell_dir, "iterations")
    if it is None or not len(it) or not {"kind", "physical_rows", "logical_draws"} <= set(it.columns):
        return np.array([])
    gen = it[(it["kind"] == "generate") & (it["logical_draws"] > 0)]
    return (gen["physical_rows"] / gen["logical_draws"]).to_numpy(float)


def dedup_table(cells: pd.DataFrame) -> pd.DataFrame:
    can = C.canonical(C.saturated(cells))
    if not len(can) or RATIO not in can.columns:
        return pd.DataFrame()
    keys = C.context_columns(can)
    rows = []
    for key, g in C.group_by(can, keys + ["policy"]):
        s = C.seed_summary(g[RATIO])
        its = np.concatenate([iteration_ratios(d) for d in g["cell_dir"]] or [np.array([])])
        q = np.percentile(its, [10, 50, 90]) if len(its) else [np.nan] * 3
        rows.append({**key, "n_seeds": s["n_seeds"], RATIO: s["mean"], "ratio_ci_low": s["ci_low"],
                     "ratio_ci_high": s["ci_high"], "iterations": len(its), "iter_ratio_p10": q[0],
                     "iter_ratio_p50": q[1], "iter_ratio_p90": q[2],
                     "dedup": bool(g["policy_dedup"].iloc[0]) if "policy_dedup" in g.columns else None})
    out = pd.DataFrame(rows)
    return C.sort_rows(out, keys + ["policy"])


def plot(table: pd.DataFrame):
    keys = C.context_columns(table, exclude=("beam",))
    groups, omitted = cap_panels(C.group_by(table, keys))
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups), width=6.0)
    for ax, (key, g) in zip(axes, groups):
        beams = sorted(g["beam"].unique())
        series = []
        for pol in C.ordered_policies(g["policy"]):
            r = g[g["policy"] == pol].set_index("beam").reindex(beams)
            # Error bars: the 10th-90th percentile of the per-iteration ratio.
            series.append({"label": pol, "values": r[RATIO], "err_low": r[RATIO] - r["iter_ratio_p10"],
                           "err_high": r["iter_ratio_p90"] - r[RATIO], "color": policy_color(pol)})
        grouped_bars(ax, [f"beam {int(b)}" for b in beams], series)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_ylabel("physical rows / logical draws")
        ax.set_ylim(bottom=0)
        ax.set_title(C.context_label(key, varying) + "\n(bars: overall; whiskers: per-iteration p10-p90)", fontsize=8)
        finish_legend(ax, fontsize=6, outside=True)
    fig.suptitle("Computation deduplication: physical/logical ratio", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, out: Path) -> Section:
    sec = Section("dedup", "Physical/logical ratio (computation deduplication)")
    table = dedup_table(cells)
    if not len(table):
        sec.missing.append(f"Physical/logical ratio: no saturated canonical cells with {RATIO}")
        return sec
    add_figure(sec, plot(table), out, "physical_logical_ratio", cells, table)
    add_table(sec, table, out, "physical_logical_ratio", "Overall and per-iteration physical/logical ratio")
    return sec
