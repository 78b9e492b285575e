"""Server occupancy over time: rows per generation iteration and KV in use.

Waiting has a price only when something is full. This section shows, for one Fig. 13
cell (saturated, the sweep's most common concurrency, 32 in the paper's setup, and the
largest beam up to 8) and one concurrency-sweep cell (the largest other concurrency),
how many rows each
generation iteration ran against the row cap (``engine.max_num_seqs``) and how much of
the generator's KV pool was in use, over the run, for nonspec and full SpecScale. The
table gives the summary's readings of the same runs (time-weighted over iterations).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import read_cell_table
from analysis.output import Section, add_figure, add_table
from analysis.plots import finish_legend, panel_grid, policy_color

POLICIES = ("nonspec", "full")
FIELDS = ("row_cap", "rows_per_iteration_mean", "rows_per_iteration_max", "row_cap_bound_share",
          "deferred_rows_mean", "kv_used_fraction_mean", "kv_peak_blocks", "kv_blocks_total", "preemptions")
MAX_POINTS = 300  # time bins per curve: a long run has tens of thousands of iterations


def chosen_cells(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, cells of POLICIES) for the Fig. 13 cell and the concurrency cell, where present."""
    sat = C.canonical(C.saturated(cells))
    if not len(sat) or "row_cap" not in sat.columns:
        return []
    sat = sat[sat["policy"].isin(POLICIES) & (sat["seed"] == sat["seed"].min())]
    if "model" in sat.columns and (sat["model"] == "qwen2.5-7b").any():
        sat = sat[sat["model"] == "qwen2.5-7b"]
    if not len(sat):
        return []
    out = []
    main = int(sat["concurrency"].mode().max())
    base = sat[sat["concurrency"] == main]
    beams = base["beam"][base["beam"] <= 8]
    beam = int(beams.max()) if len(beams) else int(base["beam"].min())
    out.append((f"Fig. 13 cell: beam {beam}, concurrency {main}", base[base["beam"] == beam]))
    other = sat[sat["concurrency"] != main]
    if len(other):
        conc = int(other["concurrency"].max())
        g = other[other["concurrency"] == conc]
        beam = int(g["beam"].min())
        out.append((f"concurrency cell: beam {beam}, concurrency {conc}", g[g["beam"] == beam]))
    return [(label, g.drop_duplicates("policy")) for label, g in out]


def binned(it: pd.DataFrame, kv_total: float) -> Optional[pd.DataFrame]:
    """Generation iterations binned in time: mean rows and KV share per bin."""
    gen = it[it["kind"] == "generate"]
    if not len(gen) or "rows" not in gen.columns:
        return None
    t = gen["t_start"].to_numpy(dtype=float)
    edges = np.linspace(t.min(), t.max() + 1e-9, min(MAX_POINTS, len(gen)) + 1)
    b = np.digitize(t, edges) - 1
    frame = pd.DataFrame({"bin": b, "rows": gen["rows"].to_numpy(dtype=float),
                          "kv": gen["kv_used_blocks"].to_numpy(dtype=float) / max(kv_total, 1.0)})
    agg = frame.groupby("bin").mean()
    agg["t"] = (edges[agg.index] + edges[np.minimum(agg.index + 1, len(edges) - 1)]) / 2
    return agg.reset_index(drop=True)


def plot(chosen: list[tuple[str, pd.DataFrame]]):
    fig, axes = panel_grid(2 * len(chosen), max_cols=2, width=5.0, height=3.0)
    for i, (label, g) in enumerate(chosen):
        ax_rows, ax_kv = axes[2 * i], axes[2 * i + 1]
        cap = None
        for _, row in g.sort_values("policy", key=C.policy_sort_key).iterrows():
            it = read_cell_table(row["cell_dir"], "iterations")
            series = binned(it, float(row["kv_blocks_total"])) if it is not None else None
            if series is None:
                continue
            color = policy_color(row["policy"])
            ax_rows.plot(series["t"], series["rows"], color=color, lw=1, label=row["policy"])
            ax_kv.plot(series["t"], 100 * series["kv"], color=color, lw=1, label=row["policy"])
            cap = row["row_cap"]
        if cap:
            ax_rows.axhline(float(cap), color="black", ls="--", lw=0.8, label=f"row cap {int(cap)}")
        ax_rows.set_ylabel("rows per iteration")
        ax_kv.set_ylabel("generator KV in use (% of pool)")
        ax_kv.set_ylim(0, 100)
        for ax in (ax_rows, ax_kv):
            ax.set_xlabel("time (s)")
            ax.set_title(label, fontsize=9)
        finish_legend(ax_rows, fontsize=6)
    fig.suptitle("Occupancy over time: rows against the cap, KV against the pool", fontsize=10)
    return fig


def build(cells: pd.DataFrame, out: Path) -> Section:
    sec = Section("occupancy", "Occupancy: rows and KV over time")
    chosen = chosen_cells(cells)
    if not chosen:
        sec.missing.append("Occupancy: no saturated nonspec/full cells with row and KV readings (RESULTS_VERSION >= 3)")
        return sec
    add_figure(sec, plot(chosen), out, "occupancy", cells,
               pd.concat([g for _, g in chosen]))
    rows = [{"cell": label, "policy": r["policy"], **{f: r.get(f) for f in FIELDS}}
            for label, g in chosen for _, r in g.iterrows()]
    add_table(sec, pd.DataFrame(rows), out, "occupancy", "Rows per iteration and KV in use (time-weighted)")
    return sec
