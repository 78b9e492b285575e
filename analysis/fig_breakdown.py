"""Fig. 15: where the time goes (generation, verification, other), as fractions of the
non-speculative baseline's total time in the same context and seed.

Like the paper's Fig. 15(a), the components of each policy share the nonspec
denominator, so a policy's bars need not sum to 1: naive speculation's sum above 1 is
its slowdown (docs/paper.md §10.2). `other` is the makespan minus generation and verification
(idle waiting and host-side work), what the paper calls the remaining component.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, note_omitted, panel_grid

COMPONENTS = ("generation", "verification", "other")
COLORS = {"generation": "#4c72b0", "verification": "#dd8452", "other": "#b0b0b0"}


def components(cells: pd.DataFrame) -> pd.DataFrame:
    """Seconds per component for each cell (other = the rest of the makespan)."""
    gen = cells["time_generation_s"].astype(float)
    ver = cells["time_verification_s"].astype(float)
    makespan = cells["makespan_s"].astype(float)
    other = (makespan - gen - ver).clip(lower=0.0)
    other = other.where(other > 1e-9 * makespan, 0.0)  # float dust when the two phases fill the makespan
    return cells.assign(t_generation=gen, t_verification=ver, t_other=other)


def breakdown_table(cells: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    sat = C.canonical(C.saturated(cells))
    need = {"time_generation_s", "time_verification_s", "makespan_s"}
    if not len(sat) or not need <= set(sat.columns):
        return pd.DataFrame()
    keys = C.context_columns(sat)
    sat = components(sat)
    base = C.of_policy(sat, "nonspec")
    parts = sat
    for comp in COMPONENTS:
        parts = C.relative_to(parts, f"t_{comp}", base.assign(**{f"t_{comp}": base["makespan_s"]}),
                              keys + ["seed"], out=f"frac_{comp}")
    parts = C.relative_to(parts, "makespan_s", base, keys + ["seed"], out="frac_total")
    rows = []
    for key, g in C.group_by(parts, keys + ["policy"]):
        row = {**key, "n_seeds": int(g["seed"].nunique()) if "seed" in g else len(g)}
        match = dict(model=key.get("model"), dataset=key.get("dataset"), beam=key.get("beam"), policy=key["policy"])
        for comp in COMPONENTS:
            ours = float(g[f"frac_{comp}"].mean())
            p = paper.value(ref, "fig15", f"time_{comp}_pct", **match) / 100.0
            row.update({f"ours_{comp}": ours, f"paper_{comp}": p, f"ratio_{comp}": ours / p})
        row["ours_total"] = float(g["frac_total"].mean())
        rows.append(row)
    out = pd.DataFrame(rows)
    return C.sort_rows(out, keys + ["policy"])


def plot(table: pd.DataFrame):
    """Stacked bars per policy, one panel per context; the paper's stack (generation and
    verification, plus other where stated) hatched beside ours."""
    keys = C.context_columns(table)
    groups, omitted = cap_panels([(k, g) for k, g in C.group_by(table, keys) if g["ours_generation"].notna().any()],
                                 lambda g: g["paper_generation"].notna().any())
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups), width=5.6)
    for ax, (key, g) in zip(axes, groups):
        pols = C.ordered_policies(g["policy"])
        g = g.set_index("policy").loc[pols]
        x = np.arange(len(pols))
        has_paper = g[[f"paper_{c}" for c in COMPONENTS]].notna().any(axis=1).to_numpy()
        w = 0.38 if has_paper.any() else 0.7
        bottom_o, bottom_p = np.zeros(len(pols)), np.zeros(len(pols))
        for comp in COMPONENTS:
            ours = np.nan_to_num(g[f"ours_{comp}"].to_numpy(dtype=float))
            ax.bar(x - (w / 2 if has_paper.any() else 0), ours, w, bottom=bottom_o, color=COLORS[comp], label=comp)
            bottom_o = bottom_o + ours  # a new array: bar() keeps a reference to `bottom`
            if has_paper.any():
                p = np.nan_to_num(g[f"paper_{comp}"].to_numpy(dtype=float))
                ax.bar(x + w / 2, p, w, bottom=bottom_p, color=COLORS[comp], hatch="//", alpha=0.45,
                       edgecolor="black", linewidth=0.5, label=f"{comp} (paper)")
                bottom_p = bottom_p + p
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, 1.08 * max(1.0, float(np.max(bottom_o)), float(np.max(bottom_p))))
        ax.set_xticks(x)
        ax.set_xticklabels(pols, rotation=30, fontsize=8)
        ax.set_ylabel("time / nonspec total time")
        ax.set_title(C.context_label(key, varying), fontsize=9)
        finish_legend(ax, fontsize=6, outside=True)
    fig.suptitle("Fig. 15: time breakdown normalised to nonspec (ours solid, paper hatched)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("fig15", "Fig. 15: time breakdown (normalised to nonspec)")
    table = breakdown_table(cells, ref)
    if not len(table):
        sec.missing.append("Fig. 15: no saturated canonical cells with time breakdown fields")
        return sec
    if table["ours_generation"].isna().all():
        sec.missing.append("Fig. 15: no nonspec cell shares a context and seed with the other policies")
        return sec
    add_figure(sec, plot(table), out, "fig15_breakdown", cells, table)
    add_table(sec, table, out, "fig15_breakdown",
              "Time components as fractions of nonspec total time (ours, paper, ours/paper)",
              paper_col="paper_generation")
    sec.notes.append("`other` = makespan - generation - verification (idle and host time). The paper's "
                     "other is stated only for nonspec (~7%).")
    return sec
