"""Adaptive verification against the fixed lazy-verification thresholds.

Per context (model pair, dataset, beam, ...) on saturated cells: `adaptive`'s output
tok/s beside `full` at every B_max swept and `ep_cd` (no LV), each a mean over seeds.
The best fixed B_max is the one with the highest mean in that context, i.e. chosen with
hindsight per cell, which `adaptive` is not allowed to do. Each comparison is paired by
seed (same problems and sampling): adaptive / best fixed and adaptive / ep_cd per seed,
with a t-interval over seeds. "Matches or beats" means the interval of adaptive / best
fixed reaches 1 (the seed-to-seed interval); "below ep_cd" means its
interval lies wholly under 1. p99 request latency is shown beside throughput; on Poisson
cells (``+experiment=adaptive_serving``) a second table compares p99 latency per rate.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.fig_lv_threshold import full_over_bmax, only_bmax_variants
from analysis.output import Section, add_figure, add_table, new_figure
from analysis.plots import finish_legend

METRIC = "output_tok_s"
P99 = "latency_p99_s"


def _per_seed(df: pd.DataFrame, metric: str) -> pd.Series:
    return df.groupby("seed")[metric].mean()


def _paired(a: pd.Series, b: pd.Series) -> dict:
    """a / b over the seeds both have: mean with its t-interval."""
    common = a.index.intersection(b.index)
    return C.seed_summary((a[common] / b[common]).tolist())


def adaptive_table(cells: pd.DataFrame) -> pd.DataFrame:
    sat = C.saturated(cells)
    adaptive = C.of_policy(C.canonical(sat), "adaptive")
    full = full_over_bmax(cells)
    ep_cd = C.of_policy(C.canonical(sat), "ep_cd")
    if not len(adaptive) or not len(full):
        return pd.DataFrame()
    keys, rows = C.context_columns(sat), []
    for key, ga, per_bmax, ge in _contexts(adaptive, full, ep_cd, keys):
        means = {b: float(g[METRIC].mean()) for b, g in per_bmax.items()}
        best = max(means, key=means.get)
        a_tok, a_p99 = _per_seed(ga, METRIC), _per_seed(ga, P99)
        vs_best = _paired(a_tok, _per_seed(per_bmax[best], METRIC))
        vs_ep = _paired(a_tok, _per_seed(ge, METRIC)) if len(ge) else C.seed_summary([])
        p99_vs_best = _paired(a_p99, _per_seed(per_bmax[best], P99))
        row = {**key, "n_seeds": int(a_tok.size), "adaptive_tok_s": float(a_tok.mean()),
               **{f"full_b{int(b)}_tok_s": m for b, m in sorted(means.items())},
               "ep_cd_tok_s": float(ge[METRIC].mean()) if len(ge) else float("nan"),
               "best_fixed_b_max": int(best), "adaptive_vs_best": vs_best["mean"],
               "adaptive_vs_best_ci_low": vs_best["ci_low"], "adaptive_vs_best_ci_high": vs_best["ci_high"],
               "adaptive_vs_ep_cd": vs_ep["mean"], "adaptive_vs_ep_cd_ci_low": vs_ep["ci_low"],
               "adaptive_vs_ep_cd_ci_high": vs_ep["ci_high"], "p99_vs_best": p99_vs_best["mean"]}
        row["matches_best"] = _reaches(vs_best, 1.0)
        row["below_ep_cd"] = bool(vs_ep["n_seeds"]) and not _reaches(vs_ep, 1.0)
        rows.append(row)
    return C.sort_rows(pd.DataFrame(rows), keys) if rows else pd.DataFrame()


def serving_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Poisson cells, per context and rate: p99 latency of adaptive beside full at every
    B_max and ep_cd; the best fixed B_max is the one with the lowest mean p99 there, and
    adaptive / best and adaptive / ep_cd are paired by seed."""
    srv = C.poisson(cells)
    adaptive = C.of_policy(C.canonical(srv), "adaptive")
    full = C.of_policy(srv, "full")
    full, ep_cd = only_bmax_variants(full), C.of_policy(C.canonical(srv), "ep_cd")
    if not len(adaptive) or not len(full):
        return pd.DataFrame()
    keys, rows = C.context_columns(srv), []  # includes rate
    for key, ga, per_bmax, ge in _contexts(adaptive, full, ep_cd, keys):
        p99 = {b: float(g[P99].mean()) for b, g in per_bmax.items()}
        best = min(p99, key=p99.get)
        a = _per_seed(ga, P99)
        vs_best = _paired(a, _per_seed(per_bmax[best], P99))
        vs_ep = _paired(a, _per_seed(ge, P99)) if len(ge) else C.seed_summary([])
        rows.append({**key, "n_seeds": int(a.size), "adaptive_p99_s": float(a.mean()),
                     **{f"full_b{int(b)}_p99_s": v for b, v in sorted(p99.items())},
                     "ep_cd_p99_s": float(ge[P99].mean()) if len(ge) else float("nan"),
                     "best_fixed_b_max": int(best), "p99_vs_best": vs_best["mean"],
                     "p99_vs_best_ci_low": vs_best["ci_low"], "p99_vs_best_ci_high": vs_best["ci_high"],
                     "p99_vs_ep_cd": vs_ep["mean"],
                     "adaptive_norm_latency_ms": float(ga["norm_latency_ms_per_output_tok"].mean()),
                     "best_fixed_norm_latency_ms": float(per_bmax[best]["norm_latency_ms_per_output_tok"].mean())})
    return C.sort_rows(pd.DataFrame(rows), keys) if rows else pd.DataFrame()


def _contexts(adaptive: pd.DataFrame, full: pd.DataFrame, ep_cd: pd.DataFrame, keys: list[str]):
    """(context, adaptive cells, {b_max: full cells}, ep_cd cells) for each context that has
    both adaptive and full cells."""
    for key, ga in C.group_by(adaptive, keys):
        k = C.key_series(ga.iloc[:1], keys).iloc[0]
        gf, ge = full[C.key_series(full, keys) == k], ep_cd[C.key_series(ep_cd, keys) == k]
        if len(gf):
            yield key, ga, {float(b): g for b, g in gf.groupby(gf["policy_b_max"].astype(float))}, ge


def _reaches(s: dict, level: float) -> bool:
    """The interval reaches `level` from below (one seed: the mean does)."""
    high = s["ci_high"] if not np.isnan(s["ci_high"]) else s["mean"]
    return bool(high >= level)


def headline(table: pd.DataFrame) -> str:
    n = len(table)
    return (f"adaptive matches or beats the best fixed B_max (within the seed interval) in "
            f"{int(table['matches_best'].sum())}/{n} contexts; its interval lies below ep_cd in "
            f"{int(table['below_ep_cd'].sum())}/{n}; median adaptive / best fixed "
            f"{table['adaptive_vs_best'].median():.3f}, median p99 latency / best fixed's "
            f"{table['p99_vs_best'].median():.3f}")


def plot(table: pd.DataFrame, keys: list[str]):
    varying = C.varying_columns(table, keys)
    labels = [C.context_label(r, varying) for r in table.to_dict("records")]
    x = np.arange(len(table))
    fig, (ax,) = new_figure(width=max(5.0, 0.3 * len(table) + 2.0), height=4.2)
    for col, name, color, dx in (("adaptive_vs_best", "adaptive / best fixed B_max", "C3", -0.15),
                                 ("adaptive_vs_ep_cd", "adaptive / ep_cd", "C0", 0.15)):
        mean = table[col].to_numpy(dtype=float)
        lo = (mean - table[f"{col}_ci_low"].to_numpy(dtype=float))
        hi = (table[f"{col}_ci_high"].to_numpy(dtype=float) - mean)
        err = np.vstack([np.nan_to_num(lo).clip(min=0), np.nan_to_num(hi).clip(min=0)])
        ax.errorbar(x + dx, mean, yerr=err, fmt="o", color=color, capsize=2, label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("throughput ratio (paired by seed)")
    ax.set_title("Adaptive verification vs the best fixed LV threshold and vs no LV", fontsize=9)
    finish_legend(ax)
    return fig


def build(cells: pd.DataFrame, ref: pd.DataFrame, out: Path) -> Section:
    sec = Section("adaptive", "Adaptive verification vs fixed B_max (beyond the paper)")
    serving = serving_table(cells)
    if len(serving):
        add_table(sec, serving, out, "adaptive_serving", "Serving (Poisson): p99 latency of adaptive vs full at "
                  "each B_max (best = lowest p99) and vs ep_cd, paired by seed")
    table = adaptive_table(cells)
    if not len(table):
        sec.missing.append("Adaptive verification: no saturated adaptive cell shares a context with full cells "
                           "at swept B_max (run: python run.py -m +experiment=adaptive_eval)")
        return sec
    keys = C.context_columns(table)
    add_figure(sec, plot(table, keys), out, "adaptive_vs_fixed", cells, table)
    add_table(sec, table, out, "adaptive_vs_fixed", "Adaptive vs full at each B_max and vs ep_cd (output tok/s)")
    sec.notes.append(headline(table) + ".")
    return sec
