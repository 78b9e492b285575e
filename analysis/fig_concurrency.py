"""Concurrency sweep: saturated throughput against the maximum concurrent requests.

The paper (docs/paper.md §10.3) reports that nonspec and FastTTS saturate around 64 while
SpecScale keeps gaining up to 128. We call a curve saturated at the smallest
concurrency that reaches 95% of its best throughput over the sweep; a curve still
within reach of its maximum only at the largest concurrency is "not saturated" there.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, log2_axis, note_omitted, panel_grid, policy_style
from specscale.metrics.operating_points import SATURATION_SHARE, saturation_point

METRIC = "output_tok_s"


def concurrency_table(cells: pd.DataFrame) -> pd.DataFrame:
    sat = C.canonical(C.saturated(cells))
    if not len(sat) or "concurrency" not in sat.columns:
        return pd.DataFrame()
    keys = C.context_columns(sat)
    sat = C.relative_to(sat, METRIC, C.of_policy(sat, "nonspec"), keys + ["seed"])
    rows = []
    for key, g in C.group_by(sat, keys + ["policy"]):
        s = C.seed_summary(g[METRIC])
        rows.append({**key, "n_seeds": s["n_seeds"], METRIC: s["mean"], f"{METRIC}_ci_low": s["ci_low"],
                     f"{METRIC}_ci_high": s["ci_high"], "throughput_vs_nonspec": float(g["rel"].mean()),
                     "norm_latency_ms_per_output_tok": float(g["norm_latency_ms_per_output_tok"].mean())})
    out = pd.DataFrame(rows)
    others = [k for k in keys if k != "concurrency"]
    out = out.sort_values(others + ["policy", "concurrency"], kind="stable").reset_index(drop=True)
    # Only contexts that actually sweep concurrency belong in this figure.
    n = out.groupby(C.key_series(out, others + ["policy"]))["concurrency"].transform("nunique")
    return out[n.to_numpy() >= 2].reset_index(drop=True)


def saturation_table(table: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    keys = C.context_columns(table, exclude=("concurrency",))
    rows = []
    for key, g in C.group_by(table, keys + ["policy"]):
        c, rel = saturation_point(g["concurrency"].to_numpy(), g[METRIC].to_numpy())
        pr = paper.rows(ref, "concurrency", "saturation_concurrency", model=key.get("model"),
                        dataset=key.get("dataset"), beam=key.get("beam"), policy=key["policy"])
        p_val = float(pr["value"].iloc[0]) if len(pr) else float("nan")
        p_rel = str(pr["relation"].iloc[0]) if len(pr) else ""
        rows.append({**key, "tested": ",".join(str(int(x)) for x in sorted(g["concurrency"])),
                     "ours_saturation": c, "ours_relation": rel, "paper_saturation": p_val, "paper_relation": p_rel,
                     "ratio_ours_to_paper": c / p_val if rel == "~" and p_rel == "~" else float("nan")})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    keys = C.context_columns(table, exclude=("concurrency",))
    groups, omitted = cap_panels(C.group_by(table, keys))
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups))
    for ax, (key, g) in zip(axes, groups):
        for pol in C.ordered_policies(g["policy"]):
            gp = g[g["policy"] == pol].sort_values("concurrency")
            ax.plot(gp["concurrency"], gp[METRIC], label=pol, **policy_style(pol))
        log2_axis(ax, g["concurrency"])
        ax.set(xlabel="max concurrent requests", ylabel="throughput (tok/s)")
        ax.set_title(C.context_label(key, varying), fontsize=9)
        finish_legend(ax)
    fig.suptitle("Concurrency sweep (saturated workload)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("concurrency", "Concurrency sweep")
    table = concurrency_table(cells)
    if not len(table):
        sec.missing.append("Concurrency sweep: no policy has saturated cells at more than one concurrency "
                           "in the same context")
        return sec
    add_figure(sec, plot(table), out, "concurrency_sweep", cells, table)
    add_table(sec, table, out, "concurrency_sweep", "Throughput per max concurrency")
    add_table(sec, saturation_table(table, ref), out, "concurrency_saturation",
              f"Saturation point (first concurrency within {100 - 100 * SATURATION_SHARE:.0f}% of the best), "
              "ours vs paper", paper_col="paper_saturation")
    return sec
