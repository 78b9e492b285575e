"""PRM batch-size distribution, invocations and flush triggers (docs/paper.md §2.2, §6, §12.5).

Naive speculation fragments verification into many small PRM calls (the paper's
motivating comparison: two to three times more invocations than nonspec); lazy
verification gathers them back into batches near B_max tokens. The distribution of
batch sizes, in tasks and in tokens, is what shows which of the two happened; the
triggers say why each batch ran.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.loader import read_cell_tables
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, note_omitted, panel_grid, plain_log_axis, policy_color


def batches(cells: pd.DataFrame) -> pd.DataFrame:
    """Every PRM batch of the given cells, with the cell's context, policy and seed."""
    vb = read_cell_tables(cells, "verify_batches")
    if not len(vb):
        return vb
    info = cells[[c for c in C.context_columns(cells) + ["policy", "seed"] if c in cells.columns]]
    return vb.join(info, on="cell")


def batch_table(cells: pd.DataFrame, ref: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table per context x policy, all batches)."""
    can = C.canonical(C.saturated(cells))
    if not len(can):
        return pd.DataFrame(), pd.DataFrame()
    vb = batches(can)
    if not len(vb):
        return pd.DataFrame(), vb
    keys = C.context_columns(can)
    inv = can.assign(prm_invocations=vb.groupby("cell").size().reindex(can.index).fillna(0).to_numpy())
    inv = C.relative_to(inv, "prm_invocations", C.of_policy(inv, "nonspec"), keys + ["seed"])
    rows = []
    for key, g in C.group_by(vb, keys + ["policy"]):
        cells_g = inv.loc[g["cell"].unique()]
        row = {**key, "n_seeds": int(g["seed"].nunique()) if "seed" in g else 1, "prm_invocations": float(cells_g["prm_invocations"].mean()),
               "invocations_vs_nonspec": float(cells_g["rel"].mean())}
        for col in ("n_tasks", "n_tokens"):
            q = np.percentile(g[col].to_numpy(float), [50, 90])
            row.update({f"{col}_mean": float(g[col].mean()), f"{col}_p50": q[0], f"{col}_p90": q[1],
                        f"{col}_max": float(g[col].max())})
        pr = paper.rows(ref, "prm_batches", "prm_invocations_ratio", model=key.get("model"),
                        dataset=key.get("dataset"), beam=key.get("beam"), policy=key["policy"], baseline="nonspec")
        row["paper_invocations_vs_nonspec"] = (f"{pr['value'].iloc[0]:g}-{pr['value_high'].iloc[0]:g}"
                                               if len(pr) else "")
        shares = g["trigger"].astype(str).value_counts(normalize=True)
        row.update({f"trigger_{t}": float(v) for t, v in sorted(shares.items())})
        rows.append(row)
    out = pd.DataFrame(rows)
    triggers = sorted(c for c in out.columns if c.startswith("trigger_"))
    out = out[[c for c in out.columns if c not in triggers] + triggers].fillna({c: 0.0 for c in triggers})
    out = C.sort_rows(out, keys + ["policy"])
    return out, vb


def plot(vb: pd.DataFrame):
    """ECDFs of batch size in tasks and in tokens, one pair of panels per context."""
    keys = [k for k in C.context_columns(vb)]
    groups, omitted = cap_panels(C.group_by(vb, keys))
    varying = C.varying_columns(vb, keys)
    fig, axes = panel_grid(2 * len(groups), max_cols=2)
    for i, (key, g) in enumerate(groups):
        for ax, col, label in ((axes[2 * i], "n_tasks", "PRM batch size (tasks)"),
                               (axes[2 * i + 1], "n_tokens", "PRM batch size (input tokens)")):
            for pol in C.ordered_policies(g["policy"]):
                x = np.sort(g.loc[g["policy"] == pol, col].to_numpy(float))
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", color=policy_color(pol),
                        label=f"{pol} ({len(x)} calls)")
            plain_log_axis(ax)
            ax.set(xlabel=label, ylabel="fraction of PRM calls <= x")
            ax.set_title(C.context_label(key, varying), fontsize=9)
            finish_legend(ax, fontsize=6)
    fig.suptitle("PRM batch-size distribution (ECDF)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("prm_batches", "PRM batch-size distribution, invocations and triggers")
    table, vb = batch_table(cells, ref)
    if not len(table):
        sec.missing.append("PRM batches: no saturated canonical cell has a non-empty verify_batches.parquet")
        return sec
    add_figure(sec, plot(vb), out, "prm_batch_sizes", cells, table)
    add_table(sec, table, out, "prm_batches",
              "PRM invocations (and ratio to nonspec), batch size in tasks and tokens, trigger shares",
              paper_col="paper_invocations_vs_nonspec")
    return sec
