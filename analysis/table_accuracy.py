"""Table 2: accuracy with intervals, and paired policy comparisons.

The paper gives point estimates only; docs/paper.md (§10.1, §12.3) asks for intervals and paired
seeds. Per policy and context: pooled accuracy over all graded requests of all seeds
with a Wilson interval, and the mean of per-seed accuracies with a t-interval (what
varies between seeds is the sampled search, not the problems). Between policies: the
paired difference on the same problems and seeds, with a bootstrap interval and
McNemar's exact test.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis import paper
from analysis.output import Section, add_figure, add_table
from analysis.paired import compare, graded_requests, paired_outcomes
from analysis.plots import policy_style, cap_panels, finish_legend, note_omitted, panel_grid, policy_color
from analysis.stats import wilson_interval

# Every policy against the baseline; shortcut policies against strict pruning, which
# isolates what the perfect-score shortcut does to answers (docs/paper.md §12.1).
SHORTCUT_POLICIES = ("ep", "ep_cd", "full")


def accuracy_table(cells: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    can = C.canonical(cells)
    keys = C.context_columns(can)
    rows = []
    for key, g in C.group_by(can, keys + ["policy"]):
        per_seed, k, n = [], 0, 0
        for cell_dir in g["cell_dir"]:
            req = graded_requests(cell_dir)
            if len(req):
                per_seed.append(float(req["correct"].mean()))
                k, n = k + int(req["correct"].sum()), n + len(req)
        if n == 0:
            continue
        lo, hi = wilson_interval(k, n)
        s = C.seed_summary(per_seed)
        p = paper.value(ref, "table2", "accuracy_pct", model=key.get("model"), dataset=key.get("dataset"),
                        beam=key.get("beam"), policy=key["policy"]) / 100.0
        acc = k / n
        rows.append({**key, "n_seeds": s["n_seeds"], "n_graded": n, "accuracy": acc, "wilson_low": lo,
                     "wilson_high": hi, "seed_mean": s["mean"], "seed_t_low": s["ci_low"], "seed_t_high": s["ci_high"],
                     "paper_accuracy": p, "diff_pp_ours_minus_paper": 100 * (acc - p), "ratio_ours_to_paper": acc / p})
    out = pd.DataFrame(rows)
    if not len(out):
        return out
    return C.sort_rows(out, keys + ["policy"])


def comparison_pairs(policies) -> list[tuple[str, str]]:
    present = set(policies)
    pairs = [(p, "nonspec") for p in C.ordered_policies(present) if p != "nonspec" and "nonspec" in present]
    pairs += [(p, "ep_strict") for p in SHORTCUT_POLICIES if p in present and "ep_strict" in present]
    return pairs


def comparison_table(cells: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    can = C.canonical(cells)
    keys = C.context_columns(can)
    rows = []
    for key, g in C.group_by(can, keys):
        for a, b in comparison_pairs(g["policy"]):
            outc = paired_outcomes(C.of_policy(g, a), C.of_policy(g, b), ["seed"])
            if not len(outc):
                continue
            match = dict(model=key.get("model"), dataset=key.get("dataset"), beam=key.get("beam"))
            p_diff = (paper.value(ref, "table2", "accuracy_pct", policy=a, **match)   # both in percent
                      - paper.value(ref, "table2", "accuracy_pct", policy=b, **match))
            if np.isnan(p_diff):
                p_diff = paper.value(ref, "table2", "accuracy_diff_pp", policy=a, baseline=b, **match)
            res = compare(outc)
            rows.append({**key, "policy_a": a, "policy_b": b, **res, "diff_pp": 100 * res["diff"],
                         "paper_diff_pp": p_diff})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    keys = C.context_columns(table)
    groups, omitted = cap_panels(C.group_by(table, keys), lambda g: g["paper_accuracy"].notna().any())
    varying = C.varying_columns(table, keys)
    fig, axes = panel_grid(len(groups))
    for ax, (key, g) in zip(axes, groups):
        pols = C.ordered_policies(g["policy"])
        g = g.set_index("policy").loc[pols]
        x = np.arange(len(pols))
        for i, pol in enumerate(pols):
            r = g.loc[pol]
            ax.errorbar([i - 0.1], [r["accuracy"]], yerr=[[r["accuracy"] - r["wilson_low"]], [r["wilson_high"] - r["accuracy"]]],
                        marker=policy_style(pol)["marker"], color=policy_color(pol), capsize=3)
            if r["paper_accuracy"] == r["paper_accuracy"]:
                ax.plot([i + 0.1], [r["paper_accuracy"]], marker="x", markersize=8, color=policy_color(pol),
                        linestyle="none")
        ax.plot([], [], marker="o", color="gray", linestyle="none", label="ours (95% Wilson)")
        if g["paper_accuracy"].notna().any():  # a paper marker only where the paper has a value
            ax.plot([], [], marker="x", color="gray", linestyle="none", label="paper")
        ax.set_xticks(x)
        ax.set_xticklabels(pols, rotation=30, fontsize=8)
        ax.set_xlim(-0.6, len(pols) - 0.4)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy")
        ax.set_title(C.context_label(key, varying), fontsize=9)
        finish_legend(ax)
    fig.suptitle("Table 2: accuracy with 95% intervals", fontsize=10)
    note_omitted(fig, omitted)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("table2", "Table 2: accuracy with intervals, and paired comparisons")
    table = accuracy_table(cells, ref)
    if not len(table):
        sec.missing.append("Table 2: no cell has graded requests (requests.parquet with `correct`)")
        return sec
    add_figure(sec, plot(table), out, "table2_accuracy", cells, table)
    add_table(sec, table, out, "table2_accuracy",
              "Accuracy: pooled with Wilson 95% interval; per-seed mean with t-interval (>= 2 seeds)",
              paper_col="paper_accuracy")
    comp = comparison_table(cells, ref)
    if len(comp):
        add_table(sec, comp, out, "paired_comparisons",
                  "Paired comparisons (a - b on the same problems and seeds): bootstrap 95% CI, exact McNemar",
                  paper_col="paper_diff_pp")
    else:
        sec.missing.append("Paired comparisons: no two policies share a context and seed (with nonspec or ep_strict)")
    if table["seed_t_low"].isna().all():
        sec.notes.append("Every policy has a single seed here: no across-seed t-intervals.")
    if table["paper_accuracy"].isna().all():
        sec.notes.append("The paper's Table 2 is for " + ", ".join(paper.models_of(ref, "table2"))
                         + "; no paper column for these cells.")
    return sec
