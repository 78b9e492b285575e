"""Mechanism ablation: which of the sim's mechanisms makes each paper ratio what it is.

Each file of conf/ablation/ switches one mechanism off (lazy verification's readings,
the row cap, the prompt template, identical sibling steps, correlated sibling errors).
For every ablation this section reads the paper's ratios from the cells run under it,
paired by seed: full / nonspec, ep_cd / ep and full / FastTTS in output tok/s, and the
Fig. 16 curve (full at each B_max over EP+CD). Each ratio's change from the unablated
sim (``ablation=none``) is drawn as a tornado: the mechanisms that move a ratio most
are the ones that explain it. Cells come from ``+experiment=mechanism_ablation`` and
``+experiment=mechanism_ablation_fig16``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from analysis import cells as C
from analysis.output import Section, add_figure, add_table
from analysis.plots import panel_grid

METRIC = "output_tok_s"
RATIOS = (("full", "nonspec"), ("ep_cd", "ep"), ("full", "fasttts"))
DEFAULT_B_MAX = 2048  # the paper's threshold: the cells the Fig. 13 ratios read
KEYS = ("model", "dataset", "beam", "concurrency", "n_problems", "workload")


def _with_ablation(cells: pd.DataFrame) -> pd.DataFrame:
    if "ablation" not in cells.columns or not len(cells):
        return pd.DataFrame()
    sat = C.saturated(cells)
    return sat[sat["ablation"].notna()]


def _keys(df: pd.DataFrame) -> list[str]:
    return [k for k in KEYS if k in df.columns]


def _paired_ratio(g: pd.DataFrame, num: str, den: str, num_filter=None, metric: str = METRIC) -> float:
    """Mean over seeds of num's metric over den's (cells of one ablation and context)."""
    a = g[g["policy"] == num]
    if num_filter is not None:
        a = a[num_filter(a)]
    b = g[g["policy"] == den]
    b = b[_at_default(b)]  # policies that ignore B_max have none: every one of their cells passes
    a, b = a.drop_duplicates("seed").set_index("seed"), b.drop_duplicates("seed").set_index("seed")
    seeds = a.index.intersection(b.index)
    if not len(seeds):
        return math.nan
    return float((a.loc[seeds, metric] / b.loc[seeds, metric]).mean())


def _at_default(df: pd.DataFrame) -> pd.Series:
    b = df["policy_b_max"] if "policy_b_max" in df.columns else pd.Series(np.nan, index=df.index)
    return b.isna() | (b == DEFAULT_B_MAX)


def ratio_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (context, ablation): each Fig. 13 ratio and its change from ablation=none."""
    df = _with_ablation(cells)
    if not len(df):
        return pd.DataFrame()
    keys = _keys(df)
    rows = []
    for key, g in C.group_by(df, keys + ["ablation"]):
        row = {**key}
        for num, den in RATIOS:
            row[f"{num}/{den}"] = _paired_ratio(g, num, den, _at_default if num == "full" else None)
        for num, den in RATIOS:  # the other reading: makespan speed-up on the same problems
            inv = _paired_ratio(g, num, den, _at_default if num == "full" else None, metric="makespan_s")
            row[f"{num}/{den} makespan"] = 1.0 / inv if inv else math.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    ratio_cols = [f"{n}/{d}" for n, d in RATIOS] + [f"{n}/{d} makespan" for n, d in RATIOS]
    out = out.dropna(subset=ratio_cols, how="all")
    if not len(out):
        return out
    base = out.loc[out["ablation"] == "none", keys + ratio_cols]
    merged = out[keys].merge(base, on=keys, how="left", suffixes=("", "_none"))
    for col in ratio_cols:
        out[f"change {col}"] = out[col].to_numpy() - merged[col].to_numpy()
    return C.sort_rows(out, keys + ["ablation"])


def fig16_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (context, ablation, B_max): full over EP+CD, paired by seed."""
    df = _with_ablation(cells)
    if not len(df) or "policy_b_max" not in df.columns:
        return pd.DataFrame()
    rows = []
    for key, g in C.group_by(df, _keys(df) + ["ablation"]):
        full = g[g["policy"] == "full"]
        for b_max in sorted(full["policy_b_max"].dropna().unique()):
            r = _paired_ratio(g, "full", "ep_cd", lambda a, b=b_max: a["policy_b_max"] == b)
            if not math.isnan(r):
                rows.append({**key, "b_max": int(b_max), "full/ep_cd": r})
    out = pd.DataFrame(rows)
    if not len(out):
        return out
    groups = _keys(out) + ["ablation"]
    out = out[out.groupby(groups)["b_max"].transform("nunique").to_numpy() >= 2]  # a curve needs two points
    return C.sort_rows(out, groups + ["b_max"]) if len(out) else pd.DataFrame()


def plot(ratios: pd.DataFrame, fig16: pd.DataFrame):
    # The tornado reads output tok/s (the protocol's metric); the makespan reading is in the table.
    cols = [c for c in ratios.columns if c.startswith("change ") and not c.endswith(" makespan")] if len(ratios) else []
    # A tornado only where some ablation has a change to draw (panels only where there is data).
    cols = [c for c in cols if ratios.loc[ratios["ablation"] != "none", c].notna().any()]
    panels = len(cols) + (1 if len(fig16) else 0)
    fig, axes = panel_grid(max(panels, 1), max_cols=2, width=5.0, height=3.2)
    for ax, col in zip(axes, cols):
        # One context per tornado: the first (the experiment has one).
        first = ratios.iloc[0]
        g = ratios[(ratios[_keys(ratios)] == first[_keys(ratios)]).all(axis=1) & (ratios["ablation"] != "none")]
        g = g.dropna(subset=[col]).sort_values(col, key=np.abs)
        ax.barh(g["ablation"], g[col], color=["#d55e00" if v < 0 else "#0072b2" for v in g[col]])
        ax.axvline(0, color="black", lw=0.8)
        base = ratios[(ratios["ablation"] == "none")][col.removeprefix("change ")]
        ax.set_title(f"{col.removeprefix('change ')} (unablated {base.iloc[0]:.2f})" if len(base) else col, fontsize=9)
        ax.set_xlabel("change when switched off")
        ax.xaxis.set_major_locator(MaxNLocator(4))  # small changes: long tick labels that would collide
        ax.tick_params(axis="y", labelsize=7)
    if len(fig16):
        ax = axes[len(cols)]
        for abl, g in fig16.groupby("ablation"):
            g = g.sort_values("b_max")
            ax.plot(g["b_max"], g["full/ep_cd"], marker="o", lw=2.0 if abl == "none" else 1.0,
                    color="black" if abl == "none" else None, label=abl)
        ax.axhline(1.0, color="gray", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B_max (tokens)")
        ax.set_ylabel("full / EP+CD")
        ax.set_title("Fig. 16 curve under each ablation", fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle("Which mechanism explains each ratio (one switched off at a time)", fontsize=10)
    return fig


def build(cells: pd.DataFrame, out: Path) -> Section:
    sec = Section("mechanism_ablation", "Mechanism ablation")
    ratios, fig16 = ratio_table(cells), fig16_table(cells)
    if not len(ratios) and not len(fig16):
        sec.missing.append("Mechanism ablation: no cells with an ablation and the policies it compares "
                           "(python run.py -m +experiment=mechanism_ablation)")
        return sec
    add_figure(sec, plot(ratios, fig16), out, "mechanism_ablation", cells)
    if len(ratios):
        add_table(sec, ratios, out, "mechanism_ablation", "Paper ratios under each ablation (output tok/s, and "
                  "the makespan speed-up on the same problems; paired by seed) and their change from the unablated sim")
    if len(fig16):
        add_table(sec, fig16, out, "mechanism_ablation_fig16", "Full over EP+CD at each B_max under each ablation")
    return sec
