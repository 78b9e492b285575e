"""The testbed section's statistics, pure functions of the benchmark record
(``specscale.testbed.record``): accuracy vs beam, strict vs shortcut, search vs the
sampling baselines, goodput under latency budgets, the PRM's step AUC and calibration."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from analysis.cells import POLICY_ORDER
from analysis.paired import compare
from analysis.stats import correct_per_s_at_budgets, mcnemar_test, wilson_interval

# (a, b): the shortcut's cost with everything else equal (ep vs ep_strict), the whole
# SpecScale policy vs the baseline (full vs nonspec), and the contract (ep_strict must
# equal nonspec on every problem).
PAIRS = (("ep", "ep_strict"), ("full", "nonspec"), ("ep_strict", "nonspec"))
METHODS = (("single", "single sample"), ("majority", "majority vote"), ("weighted", "PRM-weighted vote"),
           ("best_of_n", "PRM best-of-N"))  # fmt: skip


def _wilson_row(k: int, n: int) -> dict:
    lo, hi = wilson_interval(k, n) if n else (np.nan, np.nan)
    return {"n": n, "correct": k, "accuracy": k / n if n else np.nan, "ci_low": lo, "ci_high": hi}


def accuracy_vs_beam(req: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (policy, beam), g in req.groupby(["policy", "beam"], sort=False):
        rows.append({"policy": policy, "beam": int(beam), **_wilson_row(int(g["correct"].sum()), len(g)),
                     "makespan_s": float(g["makespan_s"].iloc[0]),
                     "shortcut_rounds": int(g["shortcut_rounds"].sum())})  # fmt: skip
    out = pd.DataFrame(rows)
    order = out["policy"].map({p: i for i, p in enumerate(POLICY_ORDER)}).fillna(len(POLICY_ORDER))
    return out.assign(_o=order).sort_values(["beam", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)


def paired_differences(req: pd.DataFrame, pairs: Sequence[tuple[str, str]] = PAIRS) -> pd.DataFrame:
    """Per beam, a - b on the same problems: paired bootstrap interval and exact McNemar."""
    rows = []
    for beam, g in req.groupby("beam"):
        by = {p: d.set_index("problem_id")["correct"] for p, d in g.groupby("policy")}
        for a, b in pairs:
            if a not in by or b not in by:
                continue
            m = pd.concat([by[a].rename("a"), by[b].rename("b")], axis=1, join="inner").reset_index()
            m["seed"] = 0
            rows.append({"beam": int(beam), "a": a, "b": b, **compare(m)})
    return pd.DataFrame(rows)


def methods_at_n(req: pd.DataFrame, base: pd.DataFrame, n: int) -> pd.DataFrame:
    """The sampling baselines over N samples and PRM beam search (nonspec, beam N) on the
    same problems, each with its Wilson interval and beam search's paired difference."""
    search = req[(req["policy"] == "nonspec") & (req["beam"] == n)].set_index("problem_id")["correct"]
    b = base.set_index("problem_id").loc[search.index]
    rows = []
    for key, name in METHODS:
        m = mcnemar_test(search.to_numpy(bool), b[key].to_numpy(bool))
        rows.append({"method": name, **_wilson_row(int(b[key].sum()), len(b)),
                     "beam_minus_method": float(search.mean() - b[key].mean()), "mcnemar_p": m.pvalue})
    rows.append({"method": f"PRM beam search (nonspec, beam {n})", **_wilson_row(int(search.sum()), len(search)),
                 "beam_minus_method": 0.0, "mcnemar_p": 1.0})  # fmt: skip
    out = pd.DataFrame(rows)
    out.insert(1, "samples", n)
    return out


def default_budgets(req: pd.DataFrame) -> list[float]:
    """Budgets at the 25/50/75/95% quantiles of every request latency of the record,
    rounded to two significant digits: the testbed's latencies are seconds, not the
    paper's minutes, and scale with the machine."""
    q = np.quantile(req["latency_s"].to_numpy(float), [0.25, 0.5, 0.75, 0.95])
    return sorted({float(f"{v:.2g}") for v in q if v > 0})


def goodput(req: pd.DataFrame, budgets: Sequence[float]) -> pd.DataFrame:
    rows = []
    for (policy, beam), g in req.groupby(["policy", "beam"], sort=False):
        per = correct_per_s_at_budgets(g["latency_s"], g["correct"], float(g["makespan_s"].iloc[0]), budgets)
        rows += [{"policy": policy, "beam": int(beam), "budget_s": b, "correct_per_s": v} for b, v in per.items()]
    return pd.DataFrame(rows).sort_values(["budget_s", "beam", "policy"], kind="stable").reset_index(drop=True)


def goodput_wide(gp: pd.DataFrame) -> pd.DataFrame:
    """One row per (policy, beam), one column per budget: the report's Markdown view."""
    wide = gp.pivot_table(index=["policy", "beam"], columns="budget_s", values="correct_per_s", sort=False)
    wide.columns = [f"at_{b:g}s" for b in wide.columns]
    return wide.reset_index().sort_values(["beam"], kind="stable").reset_index(drop=True)


def timing_noise(acc: pd.DataFrame) -> str:
    """ep and ep_strict do the same work when the shortcut never fires (no exact 1.0
    reward): their makespan ratio then measures the clock's noise on this machine."""
    a = acc.set_index(["policy", "beam"])
    if not {"ep", "ep_strict"} <= set(acc["policy"]) or a.loc["ep", "shortcut_rounds"].sum() > 0:
        return ""
    r = a.loc["ep", "makespan_s"] / a.loc["ep_strict", "makespan_s"]
    return (f"The shortcut never fired (no exact 1.0 reward), so ep did the same work as ep_strict: their "
            f"makespan ratio, {r.min():.2f}-{r.max():.2f} across beams, is the timing noise of this machine; "
            "read time differences smaller than that as noise.")


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """P(score of a positive > score of a negative), ties counted half (Mann-Whitney U)."""
    if not len(pos) or not len(neg):
        return float("nan")
    return float(mannwhitneyu(pos, neg).statistic) / (len(pos) * len(neg))


def prm_auc(steps: pd.DataFrame) -> pd.DataFrame:
    """Per source: AUC of right steps against every wrong step and against first wrong
    steps only (the harder case: later wrong steps follow a visible mistake)."""
    rows = []
    for source, g in steps.groupby("source"):
        right = g.loc[g["label"] == 1, "score"]
        wrong = g.loc[g["label"] == 0, "score"]
        first = g.loc[g["first_wrong"] == 1, "score"]
        rows.append({"source": source, "auc_all_wrong": auc(right, wrong), "auc_first_wrong": auc(right, first),
                     "right_steps": len(right), "wrong_steps": len(wrong), "first_wrong_steps": len(first),
                     "exact_one_share": float((g["score"] >= 1.0).mean())})  # fmt: skip
    return pd.DataFrame(rows)


def calibration(steps: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Reliability diagram data: per source and equal-width score bin, the mean p(+) and
    the share of steps that are right; with the expected calibration error (bin-weighted
    |gap|) and the Brier score of the source repeated on its rows."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    rows = []
    for source, g in steps.groupby("source"):
        b = pd.cut(g["score"], edges, include_lowest=True)
        t = g.groupby(b, observed=True).agg(mean_score=("score", "mean"), frac_right=("label", "mean"),
                                            steps=("label", "size")).reset_index(drop=True)
        ece = float((t["steps"] * (t["mean_score"] - t["frac_right"]).abs()).sum() / t["steps"].sum())
        brier = float(((g["score"] - g["label"]) ** 2).mean())
        rows.append(t.assign(source=source, ece=ece, brier=brier))
    return pd.concat(rows, ignore_index=True)[["source", "mean_score", "frac_right", "steps", "ece", "brier"]]
