"""Fig. 16: sensitivity to the lazy-verification token threshold B_max.

Throughput of `full` at each B_max relative to `ep_cd` (EP+CD without LV) in the same
context and seed: the dashed line at 1 is the no-LV reference of the paper's figure.
docs/paper.md (§6.3, §10.2) reads the curve as a trade-off: bigger PRM batches are cheaper
per score but deliver pruning information later; past some threshold (4,096 in the
paper) the delay costs more than the batching saves.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.output import Section, add_figure, add_table
from analysis.plots import cap_panels, finish_legend, log2_axis, note_omitted, panel_grid

METRIC = "output_tok_s"
_ONLY_BMAX = re.compile(r"^b_max=[^,]+$")


def full_over_bmax(cells: pd.DataFrame) -> pd.DataFrame:
    """Saturated `full` cells whose switches are the paper's except possibly b_max."""
    return only_bmax_variants(C.of_policy(C.saturated(cells), "full"))


def only_bmax_variants(full: pd.DataFrame) -> pd.DataFrame:
    """`full` cells whose switches are the paper's except possibly b_max (recorded)."""
    if "policy_b_max" not in full.columns:
        return full.iloc[0:0]
    keep = full["variant"].map(lambda v: v == "" or bool(_ONLY_BMAX.match(str(v)))).astype(bool)  # bool if empty
    return full[keep & full["policy_b_max"].notna()]


def threshold_table(cells: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    full = full_over_bmax(cells)
    if not len(full):
        return pd.DataFrame()
    keys = C.context_columns(full)
    base = C.of_policy(C.canonical(C.saturated(cells)), "ep_cd")
    rel = C.relative_to(full.assign(b_max=full["policy_b_max"].astype(float)), METRIC, base, keys + ["seed"])
    rows = []
    for key, g in C.group_by(rel, keys + ["b_max"]):
        s = C.seed_summary(g["rel"])
        pr = paper.rows(ref, "fig16", "throughput_ratio", model=key.get("model"), dataset=key.get("dataset"),
                        beam=key.get("beam"), x_value=key["b_max"])
        p_val = float(pr["value"].iloc[0]) if len(pr) else float("nan")
        p_rel = str(pr["relation"].iloc[0]) if len(pr) else ""
        exact = p_rel in ("=", "~")
        rows.append({**key, "n_seeds": s["n_seeds"], "ours_tok_s": float(g[METRIC].mean()),
                     "ours_vs_ep_cd": s["mean"], "ours_vs_ep_cd_ci_low": s["ci_low"],
                     "ours_vs_ep_cd_ci_high": s["ci_high"], "paper_vs_ep_cd": p_val if exact else float("nan"),
                     "paper_statement": _statement(p_rel, p_val),
                     "ratio_ours_to_paper": s["mean"] / p_val if exact else float("nan")})
    out = pd.DataFrame(rows).sort_values(keys + ["b_max"], kind="stable").reset_index(drop=True)
    # Only contexts that sweep the threshold: a lone default full cell is not a curve.
    n = out.groupby(C.key_series(out, keys))["b_max"].transform("nunique")
    return out[n.to_numpy() >= 2].reset_index(drop=True)


def _statement(relation: str, value: float) -> str:
    if not relation:
        return ""
    return {"=": f"{value:g}", "~": f"~{value:g}", "<": f"below {value:g}", ">": f"above {value:g}"}.get(
        relation, f"{relation} {value:g}")


def plot(table: pd.DataFrame, ref: pd.DataFrame):
    keys = C.context_columns(table, exclude=("beam",))
    groups, omitted = cap_panels([(k, g) for k, g in C.group_by(table, keys) if g["ours_vs_ep_cd"].notna().any()],
                                 lambda g: g["paper_statement"].ne("").any())
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups))
    for ax, (key, g) in zip(axes, groups):
        for i, (bkey, gb) in enumerate(C.group_by(g.sort_values("b_max"), ["beam"])):
            color = f"C{i}"
            ax.errorbar(gb["b_max"], gb["ours_vs_ep_cd"],
                        yerr=_err(gb), marker="o", color=color, capsize=2, label=f"beam {int(bkey['beam'])}")
            pr = paper.rows(ref, "fig16", "throughput_ratio", model=key.get("model"),
                            dataset=key.get("dataset"), beam=bkey["beam"])
            for r in pr.itertuples():
                marker = "v" if r.relation == "<" else "^" if r.relation == ">" else "s"
                ax.plot([float(r.x_value)], [float(r.value)], marker=marker, markersize=8, color=color,
                        markerfacecolor="none", linestyle="none")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="EP+CD, no LV")
        log2_axis(ax, g["b_max"])
        ax.set_xlabel("LV token threshold B_max")
        ax.set_ylabel("throughput / ep_cd")
        ax.set_title(C.context_label(key, varying) + "\n(open markers: paper; ▽ = below)", fontsize=8)
        finish_legend(ax)
    fig.suptitle("Fig. 16: LV threshold sensitivity", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def _err(g: pd.DataFrame):
    lo = (g["ours_vs_ep_cd"] - g["ours_vs_ep_cd_ci_low"]).fillna(0).clip(lower=0)
    hi = (g["ours_vs_ep_cd_ci_high"] - g["ours_vs_ep_cd"]).fillna(0).clip(lower=0)
    return np.vstack([lo.to_numpy(), hi.to_numpy()])


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("fig16", "Fig. 16: LV threshold sensitivity (throughput relative to ep_cd)")
    full = full_over_bmax(cells)
    if not len(full):
        sec.missing.append("Fig. 16: no saturated cells of policy full with a recorded policy_b_max")
        return sec
    counts = [int(g["policy_b_max"].nunique()) for _, g in C.group_by(full, C.context_columns(full))]
    if max(counts, default=0) < 2:
        sec.missing.append("Fig. 16: no cells of policy full with more than one policy_b_max in the same context")
        return sec
    table = threshold_table(cells, ref)
    if table["ours_vs_ep_cd"].isna().all():
        sec.missing.append("Fig. 16: no ep_cd cell shares a context and seed with the full cells, "
                           "so there is no no-LV reference")
        add_table(sec, table, out, "fig16_lv_threshold", "LV threshold sweep (absolute tokens/s only)")
        return sec
    add_figure(sec, plot(table, ref), out, "fig16_lv_threshold", cells, table)
    add_table(sec, table, out, "fig16_lv_threshold", "Throughput of full relative to ep_cd over B_max",
              paper_col="paper_statement")
    if table["paper_statement"].eq("").all():
        sec.notes.append("The paper's Fig. 16 is for " + ", ".join(paper.models_of(ref, "fig16"))
                         + " on math500; no paper column for these cells.")
    return sec
