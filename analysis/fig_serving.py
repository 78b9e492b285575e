"""Serving curves: normalised latency (and raw p99 latency) against Poisson request rate.

The paper plots normalised latency (end-to-end latency / output tokens, docs/design.md §5);
docs/paper.md (§2.3, §12.3) warns that this denominator moves with the amount of generated
work, so the raw p99 is drawn beside it. The paper's operating points (about 75 ms per
token at ~1.6 req/s for SpecScale, ~0.8 req/s for FastTTS) are compared with the rate
at which our curve crosses the same latency level.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, note_omitted, panel_grid, policy_color, policy_style
from specscale.metrics.operating_points import rate_at_latency

LAT = "norm_latency_ms_per_output_tok"  # the paper's reading: per token of the returned response (docs/design.md §5)
P99 = "latency_p99_s"


def curve_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (context, policy, rate): seed means with t-intervals, and the
    latency relative to nonspec at the same rate and seed."""
    srv = C.canonical(C.poisson(cells))
    if not len(srv) or "rate" not in srv.columns:
        return pd.DataFrame()
    keys = C.context_columns(srv)  # includes rate
    srv = C.relative_to(srv, LAT, C.of_policy(srv, "nonspec"), keys + ["seed"], out="lat_rel")
    rows = []
    for key, g in C.group_by(srv, keys + ["policy"]):
        lat, p99 = C.seed_summary(g[LAT]), C.seed_summary(g[P99])
        rows.append({**key, "n_seeds": lat["n_seeds"], LAT: lat["mean"], f"{LAT}_ci_low": lat["ci_low"],
                     f"{LAT}_ci_high": lat["ci_high"], P99: p99["mean"], f"{P99}_ci_low": p99["ci_low"],
                     f"{P99}_ci_high": p99["ci_high"], "latency_vs_nonspec": float(g["lat_rel"].mean())})
    out = pd.DataFrame(rows)
    return out.sort_values([k for k in keys if k != "rate"] + ["policy", "rate"], kind="stable").reset_index(drop=True)


def operating_points(curves: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    """Ours vs the paper's sustained rate at the paper's latency level."""
    keys = C.context_columns(curves, exclude=("rate",))
    rows = []
    for key, g in C.group_by(curves, keys + ["policy"]):
        pr = paper.rows(ref, "serving", "request_rate_req_s", model=key.get("model"), dataset=key.get("dataset"),
                        beam=key.get("beam"), policy=key["policy"])
        for r in pr.itertuples():
            level = float(r.x_value)
            ours, rel = rate_at_latency(g["rate"].to_numpy(), g[LAT].to_numpy(), level)
            rows.append({**key, "latency_level_ms_per_tok": level, "ours_rate_req_s": ours,
                         "ours_relation": rel, "paper_rate_req_s": float(r.value),
                         "ratio_ours_to_paper": ours / float(r.value) if rel == "=" else float("nan")})
    return pd.DataFrame(rows)


def plot(curves: pd.DataFrame, ref: pd.DataFrame):
    keys = C.context_columns(curves, exclude=("rate",))
    groups, omitted = cap_panels(C.group_by(curves, keys))
    varying = C.varying_columns(curves, keys)
    fig, axes = panel_grid(2 * len(groups), max_cols=2)
    for i, (key, g) in enumerate(groups):
        ax_lat, ax_p99 = axes[2 * i], axes[2 * i + 1]
        for pol in C.ordered_policies(g["policy"]):
            gp = g[g["policy"] == pol].sort_values("rate")
            col = policy_color(pol)
            ax_lat.plot(gp["rate"], gp[LAT], label=pol, **policy_style(pol))
            ax_p99.plot(gp["rate"], gp[P99], label=pol, **policy_style(pol))
            pr = paper.rows(ref, "serving", "request_rate_req_s", model=key.get("model"),
                            dataset=key.get("dataset"), beam=key.get("beam"), policy=pol)
            for r in pr.itertuples():
                ax_lat.plot([float(r.value)], [float(r.x_value)], marker="*", markersize=11, color=col,
                            markerfacecolor="none", linestyle="none", label=f"{pol} (paper, ~)")
        title = C.context_label(key, varying)
        ax_lat.set(xlabel="request rate (req/s)", ylabel="normalised latency (ms/token)")
        ax_p99.set(xlabel="request rate (req/s)", ylabel="raw p99 latency (s)")
        ax_lat.set_title(title, fontsize=9)
        ax_p99.set_title(title, fontsize=9)
        finish_legend(ax_lat)
        finish_legend(ax_p99)
    fig.suptitle("Serving curves (Poisson arrivals)", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("serving", "Serving curves: normalised latency and p99 vs request rate")
    curves = curve_table(cells)
    if not len(curves):
        sec.missing.append("Serving curves: no canonical cells with workload poisson")
        return sec
    keys = C.context_columns(curves, exclude=("rate",))
    n_rates = max(int(g["rate"].nunique()) for _, g in C.group_by(curves, keys + ["policy"]))
    if n_rates < 2:
        sec.missing.append("Serving curves: no policy has poisson cells at more than one request rate "
                           "in the same context")
        add_table(sec, curves, out, "serving_points", "Poisson cells (single rate)")
        return sec
    add_figure(sec, plot(curves, ref), out, "serving_curves", cells, curves)
    add_table(sec, curves, out, "serving_curves", "Normalised latency and raw p99 per rate")
    ops = operating_points(curves, ref)
    if len(ops):
        add_table(sec, ops, out, "serving_operating_points",
                  "Rate sustained at the paper's latency level: ours (interpolated) vs paper")
    else:
        sec.notes.append("The paper's serving operating points are for qwen2.5-7b at beam 4; "
                         "none of these cells match.")
    return sec
