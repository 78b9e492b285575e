"""Raw latency percentiles and correct answers per second under latency budgets.

Review §12.3 proposes a deployment-facing metric: requests answered correctly within a
latency budget L, per second of makespan. Unlike output tokens per second it does not
count extra generated tokens as useful, and it makes the latency requirement explicit.
It is reported beside accuracy and the raw p50/p90/p99 it summarises, all recomputed
from requests.parquet (so budgets need not be the ones the harness wrote).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import read_cell_table
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, note_omitted, panel_grid, policy_color
from analysis.stats import correct_per_s_at_budgets, latency_percentiles

_BUDGET_COL = re.compile(r"^correct_per_s_at_budget_([0-9.]+)s$")


def summary_budgets(cells: pd.DataFrame) -> list[float]:
    """The budgets the harness summarised (columns correct_per_s_at_budget_<L>s)."""
    found = {float(m.group(1)) for c in cells.columns if (m := _BUDGET_COL.match(str(c)))}
    return sorted(found)


def cell_requests(cell_dir) -> Optional[pd.DataFrame]:
    req = read_cell_table(cell_dir, "requests")
    if req is None or not len(req) or "latency_s" not in req.columns:
        return None
    return req


def informative_budgets(cells: pd.DataFrame, budgets: Sequence[float]) -> tuple[list[float], str]:
    """The budgets to report. If every request of every cell meets every budget, the
    metric degenerates to plain correct answers per second; then add budgets at the
    25th/50th/75th percentile of all request latencies (2 significant digits)."""
    lats = [r["latency_s"].to_numpy(float) for d in cells["cell_dir"] if (r := cell_requests(d)) is not None]
    if not lats:
        return list(budgets), ""
    allat = np.concatenate(lats)
    if budgets and min(budgets) < allat.max():
        return list(budgets), ""
    auto = sorted({_round_sig(float(np.percentile(allat, q))) for q in (25, 50, 75)} - {0.0})
    pct = f"the 25/50/75th percentiles of all request latencies: {', '.join(f'{b:g}' for b in auto)} s"
    note = (f"Every request met every budget ({', '.join(f'{b:g}' for b in budgets)} s), so budgets were added at "
            f"{pct}." if budgets else f"No budgets recorded in the summaries; budgets at {pct}.")
    return sorted(set(budgets) | set(auto)), note


def _round_sig(x: float, digits: int = 2) -> float:
    if x <= 0:
        return 0.0
    return round(x, -int(math.floor(math.log10(x))) + digits - 1)


def latency_table(cells: pd.DataFrame, budgets: Sequence[float]) -> pd.DataFrame:
    can = C.canonical(cells)
    keys = C.context_columns(can)
    rows = []
    for key, g in C.group_by(can, keys + ["policy"]):
        per_cell = []
        for rec in g.to_dict("records"):
            req = cell_requests(rec["cell_dir"])
            if req is None:
                continue
            correct = req["correct"].tolist() if "correct" in req.columns else [None] * len(req)
            m = latency_percentiles(req["latency_s"])
            m.update({f"correct_per_s_at_{b:g}s": v for b, v in
                      correct_per_s_at_budgets(req["latency_s"], correct, float(rec["makespan_s"]), budgets).items()})
            per_cell.append(m)
        if not per_cell:
            continue
        df = pd.DataFrame(per_cell)
        p99 = C.seed_summary(df["latency_p99_s"])
        row = {**key, "n_seeds": len(df)}
        row.update({c: float(df[c].mean()) for c in df.columns})
        row.update(latency_p99_s_ci_low=p99["ci_low"], latency_p99_s_ci_high=p99["ci_high"])
        rows.append(row)
    out = pd.DataFrame(rows)
    if not len(out):
        return out
    return C.sort_rows(out, keys + ["policy"])


def goodput_curves(cells: pd.DataFrame, n_points: int = 60) -> pd.DataFrame:
    """budget_s, correct_per_s for each (context, policy), averaged over seeds on a
    common grid from 0 to the largest latency of the group."""
    can = C.canonical(cells)
    keys = C.context_columns(can)
    out = []
    for key, g in C.group_by(can, keys):
        reqs = {rec["cell_dir"]: (cell_requests(rec["cell_dir"]), rec) for rec in g.to_dict("records")}
        lat_max = max((r["latency_s"].max() for r, _ in reqs.values() if r is not None), default=float("nan"))
        if not lat_max == lat_max:
            continue
        grid = np.linspace(0.0, float(lat_max) * 1.05, n_points)
        for pol in C.ordered_policies(g["policy"]):
            curves = []
            for req, rec in reqs.values():
                if req is None or rec["policy"] != pol or "correct" not in req.columns:
                    continue
                ok = np.sort(req.loc[req["correct"].fillna(False).astype(bool), "latency_s"].to_numpy(float))
                curves.append(np.searchsorted(ok, grid, side="right") / float(rec["makespan_s"]))
            if curves:
                out.append(pd.DataFrame({**key, "policy": pol, "budget_s": grid,
                                         "correct_per_s": np.mean(curves, axis=0)}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def plot(curves: pd.DataFrame):
    keys = C.context_columns(curves)
    groups, omitted = cap_panels(C.group_by(curves, keys))
    varying = C.varying_columns(curves, keys)
    fig, axes = panel_grid(len(groups))
    for ax, (key, g) in zip(axes, groups):
        for pol in C.ordered_policies(g["policy"]):
            gp = g[g["policy"] == pol]
            ax.step(gp["budget_s"], gp["correct_per_s"], where="post", color=policy_color(pol), label=pol)
        ax.set(xlabel="latency budget L (s)", ylabel="correct answers / s within L")
        ax.set_title(C.context_label(key, varying), fontsize=9)
        finish_legend(ax)
    fig.suptitle("Correct answers per second under a latency budget", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, out: Path, budgets: Optional[Sequence[float]] = None) -> Section:
    sec = Section("latency", "Raw latency percentiles and correct answers per second under latency budgets")
    can = C.canonical(cells)
    if not len(can):
        sec.missing.append("Latency: no canonical cells")
        return sec
    listed = list(budgets) if budgets else summary_budgets(can)
    chosen, note = informative_budgets(can, listed) if budgets is None else (list(budgets), "")
    if note:
        sec.notes.append(note)
    table = latency_table(can, chosen)
    if not len(table):
        sec.missing.append("Latency: no cell has a readable requests.parquet")
        return sec
    add_table(sec, table, out, "latency_goodput",
              "Raw latency p50/p90/p99 (s) and correct answers per second within each budget (mean over seeds)")
    curves = goodput_curves(can)
    if len(curves):
        add_figure(sec, plot(curves), out, "goodput_vs_budget", can, curves)
    return sec
