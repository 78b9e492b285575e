"""Search family: compute-optimal scaling on the testbed, measured and predicted.

Reads the cells of ``python run.py -m +experiment=search_family`` (conf/experiment/
search_family.yaml): every search of conf/search/ on the torch engine (measured) and on
the sim (predicted, with the testbed's fitted workload and cost profile).

* **Scaling** (policy nonspec, N = 1..64): accuracy with 95% Wilson intervals per search,
  N and difficulty level (the dataset's ``level``; the sim's synthetic problems have
  none, so its rows are "all" only), beside the generated tokens per problem and the
  wall time (makespan) of the cell: accuracy against N, against tokens and against time.
* **Which search wins**: per level and N, the search with the highest measured accuracy
  and whether its interval clears the runner-up's point estimate.
* **Policies** (every policy a search can run, at one N): the speed-up over nonspec of
  the same search, N and seed (makespan ratio: the same problems, the same work asked),
  and correct answers per second under latency budgets; latency is a request's service
  time (admission to answer), because the cells are saturated: time spent queueing for a
  concurrency slot says where a request stood in the queue, not how fast its search was.
* **Predicted vs measured**: the sim's speed-up beside the torch engine's per search x
  policy, and its relative error.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from analysis import cells as C
from analysis.loader import load_index, read_cell_tables
from analysis.output import Section, add_figure, add_table
from analysis.plots import panel_grid
from analysis.stats import correct_per_s_at_budgets, t_interval, wilson_interval

EXPERIMENT = "search_family"
SEARCHES = ("best_of_n", "beam", "dvts", "rebase")
SEARCH_COLORS = {"best_of_n": "#4c72b0", "beam": "#dd8452", "dvts": "#55a868", "rebase": "#c44e52"}
ALL = "all"
DEFAULT_BUDGETS_S = (0.25, 0.5, 1.0, 2.0)  # service-time budgets on the CPU testbed (seconds)
SPEEDUP_GOAL = 0.10  # the sim's speed-up within 10% of the measured one
RATIO = "physical_logical_ratio"  # generated / logical tokens (a summary key)


def family_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The search-family experiment's cells (every search kind present; old cells without a
    ``search`` field are beam search)."""
    if not len(cells) or "experiment" not in cells.columns:
        return pd.DataFrame()
    df = cells[cells["experiment"] == EXPERIMENT].copy()
    if len(df) and "search" in df.columns:
        df["search"] = df["search"].fillna("beam")
    return df.reset_index(drop=True)


def _requests(df: pd.DataFrame) -> pd.DataFrame:
    req = read_cell_tables(df, "requests")
    if not len(req):
        return req
    req = req.join(df[["engine", "search", "policy", "beam", "seed"]], on="cell")
    req["level"] = req["level"].map(lambda v: ALL if C.is_missing(v) else str(int(v))) if "level" in req else ALL
    req["correct"] = req["correct"].fillna(False).astype(bool)
    return req


def scaling_table(df: pd.DataFrame, req: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Accuracy [95% CI] per engine x search x N x level (and over all levels), under nonspec,
    with tokens generated per problem and the cell's makespan."""
    base = C.of_policy(df, "nonspec") if len(df) else df
    if not len(base):
        return pd.DataFrame()
    req = _requests(base) if req is None else req
    if not len(req):
        return pd.DataFrame()
    req = req[req["policy"] == "nonspec"]
    cell_cols = base[["engine", "search", "beam", "seed", "decoded_tokens", "n_requests", "makespan_s"]]
    rows = []
    for (engine, search, beam), g in req.groupby(["engine", "search", "beam"], sort=True):
        cells_here = cell_cols[(cell_cols["engine"] == engine) & (cell_cols["search"] == search)
                               & (cell_cols["beam"] == beam)]  # fmt: skip
        tokens = float(cells_here["decoded_tokens"].sum() / max(cells_here["n_requests"].sum(), 1))
        wall = float(cells_here["makespan_s"].mean())
        levels = [(ALL, g)] + ([(lv, gl) for lv, gl in g.groupby("level") if lv != ALL] if (g["level"] != ALL).any()
                               else [])  # fmt: skip
        for level, gl in levels:
            k, n = int(gl["correct"].sum()), len(gl)
            lo, hi = wilson_interval(k, n)
            rows.append({"engine": engine, "search": search, "N": int(beam), "level": level, "n": n,
                         "accuracy": k / n, "ci_low": lo, "ci_high": hi, "tokens_per_problem": tokens,
                         "makespan_s": wall, "seeds": int(cells_here["seed"].nunique())})  # fmt: skip
    return pd.DataFrame(rows)


def winners(scaling: pd.DataFrame) -> pd.DataFrame:
    """Per level and N (measured cells): the most accurate search, the runner-up, and
    whether the winner's lower 95% bound is above the runner-up's accuracy ("clear")."""
    m = scaling[scaling["engine"] == "torch"] if len(scaling) else scaling
    rows = []
    for (level, n), g in m.groupby(["level", "N"], sort=True):
        if g["search"].nunique() < 2:
            continue
        g = g.sort_values("accuracy", ascending=False, kind="stable")
        best, second = g.iloc[0], g.iloc[1]
        rows.append({"level": level, "N": int(n), "best": best["search"], "accuracy": best["accuracy"],
                     "ci_low": best["ci_low"], "runner_up": second["search"], "runner_up_accuracy": second["accuracy"],
                     "clear": bool(best["ci_low"] > second["accuracy"])})  # fmt: skip
    return pd.DataFrame(rows)


def policy_table(df: pd.DataFrame, budgets_s: Sequence[float] = DEFAULT_BUDGETS_S,
                 req: Optional[pd.DataFrame] = None) -> pd.DataFrame:  # fmt: skip
    """Per engine x search x N x policy (where more than nonspec ran): accuracy with its 95%
    Wilson interval (the seeds' requests pooled), makespan speed-up over nonspec (paired by
    seed; a 95% t interval over the seeds' ratios where two or more ran), the generated share
    of the logical tokens (``physical_logical_ratio``: what deduplication saved) and correct
    answers per second under service-time budgets."""
    if not len(df):
        return pd.DataFrame()
    keys = ["engine", "search", "beam"]
    many = df.groupby(keys)["policy"].transform("nunique") > 1
    df = df[many]
    if not len(df):
        return pd.DataFrame()
    req = _requests(df) if req is None else req
    rows = []
    for key, g in df.groupby(keys, sort=True):
        base = g[g["policy"] == "nonspec"].drop_duplicates("seed").set_index("seed")
        for policy, gp in g.groupby("policy"):
            gp = gp.drop_duplicates("seed")
            mine = req[req["cell"].isin(gp.index)]  # req's cell = the cell's row label in df
            gp = gp.set_index("seed")
            seeds = gp.index.intersection(base.index)
            ratios = (base.loc[seeds, "makespan_s"] / gp.loc[seeds, "makespan_s"]).to_numpy(dtype=float)
            speedup = float(ratios.mean()) if len(ratios) else math.nan
            acc_lo, acc_hi = (wilson_interval(int(mine["correct"].sum()), len(mine)) if len(mine)
                              else (math.nan, math.nan))
            sp_lo, sp_hi = t_interval(ratios)
            row = {"engine": key[0], "search": key[1], "N": int(key[2]), "policy": policy,
                   "accuracy": float(gp["accuracy"].mean()), "accuracy_ci_low": acc_lo, "accuracy_ci_high": acc_hi,
                   "makespan_s": float(gp["makespan_s"].mean()), "seeds": len(ratios),
                   "speedup_vs_nonspec": speedup, "speedup_ci_low": sp_lo, "speedup_ci_high": sp_hi,
                   "physical_logical_ratio": float(gp[RATIO].mean()) if RATIO in gp else math.nan}  # fmt: skip
            service = (mine["finish_s"] - mine["admit_s"]).to_numpy()
            within = correct_per_s_at_budgets(service, mine["correct"].tolist(), float(gp["makespan_s"].sum()), budgets_s)
            row.update({f"correct_per_s_within_{b:g}s": v for b, v in within.items()})
            rows.append(row)
    out = pd.DataFrame(rows)
    out["order"] = C.policy_sort_key(out["policy"])
    return out.sort_values(["engine", "search", "N", "order"], kind="stable").drop(columns="order").reset_index(drop=True)


def predicted_vs_measured(policies: pd.DataFrame) -> pd.DataFrame:
    """The sim's speed-up over nonspec beside the torch engine's (with its interval over
    seeds where two or more ran), per search x N x policy, with each engine's generated
    share of the logical tokens (where the speed-up of a deduplicating policy comes from)."""
    if not len(policies) or not {"torch", "sim"} <= set(policies["engine"]):
        return pd.DataFrame()
    keys = ["search", "N", "policy"]
    m = policies[policies["engine"] == "torch"].set_index(keys)
    p = policies[policies["engine"] == "sim"].set_index(keys)
    both = m.index.intersection(p.index)
    out = pd.DataFrame({"measured_speedup": m.loc[both, "speedup_vs_nonspec"],
                        "measured_ci_low": m.loc[both, "speedup_ci_low"],
                        "measured_ci_high": m.loc[both, "speedup_ci_high"],
                        "predicted_speedup": p.loc[both, "speedup_vs_nonspec"],
                        "measured_accuracy": m.loc[both, "accuracy"], "predicted_accuracy": p.loc[both, "accuracy"],
                        "measured_physical_logical": m.loc[both, RATIO], "predicted_physical_logical": p.loc[both, RATIO]})
    out["speedup_error"] = out["predicted_speedup"] / out["measured_speedup"] - 1.0
    out["within_goal"] = out["speedup_error"].abs() <= SPEEDUP_GOAL
    out = out.reset_index()
    return out[out["policy"] != "nonspec"].reset_index(drop=True)


def plot_scaling(scaling: pd.DataFrame):
    """Accuracy vs N per level (measured: lines with 95% bands; predicted: dashed, all
    levels), then accuracy vs tokens per problem and vs wall time (all levels)."""
    levels = sorted(set(scaling["level"]) - {ALL}) + [ALL]
    fig, axes = panel_grid(len(levels) + 2, max_cols=4, width=3.9, height=3.2)
    for ax, level in zip(axes, levels):
        for search in SEARCHES:
            for engine, style in (("torch", "-"), ("sim", "--")):
                g = scaling[(scaling["search"] == search) & (scaling["level"] == level) & (scaling["engine"] == engine)]
                if not len(g):
                    continue
                g = g.sort_values("N")
                label = search if engine == "torch" else f"{search} (sim)"
                ax.plot(g["N"], g["accuracy"], style, marker="o", markersize=3, color=SEARCH_COLORS[search], label=label)
                if engine == "torch":
                    ax.fill_between(g["N"], g["ci_low"], g["ci_high"], color=SEARCH_COLORS[search], alpha=0.12)
        ax.set_xscale("log", base=2)
        ax.set_title(f"level {level}" if level != ALL else "all levels")
        ax.set_xlabel("N (samples / beam width)")
        ax.set_ylabel("accuracy")
    allv = scaling[(scaling["level"] == ALL) & (scaling["engine"] == "torch")]
    for ax, col, label in ((axes[len(levels)], "tokens_per_problem", "generated tokens per problem"),
                           (axes[len(levels) + 1], "makespan_s", "wall time of the cell (s)")):
        for search in SEARCHES:
            g = allv[allv["search"] == search].sort_values("N")
            if len(g):
                ax.plot(g[col], g["accuracy"], marker="o", markersize=3, color=SEARCH_COLORS[search], label=search)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("accuracy (all levels, measured)")
    for ax in axes[len(levels) + 2:]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    axes[len(levels) - 1].legend(fontsize=6)  # the all-levels panel: measured and predicted lines
    return fig


def plot_policies(pvm: pd.DataFrame, policies: pd.DataFrame):
    """Speed-up over nonspec per search x policy: measured bars, predicted markers."""
    m = policies[(policies["engine"] == "torch") & (policies["policy"] != "nonspec")]
    fig, axes = panel_grid(1, width=max(6.0, 0.45 * len(m) + 2), height=3.6)
    ax = axes[0]
    labels = [f"{r.search}\n{r.policy}" for r in m.itertuples()]
    x = np.arange(len(m))
    ax.bar(x, m["speedup_vs_nonspec"], color=[SEARCH_COLORS.get(s, "#999") for s in m["search"]], alpha=0.8,
           label="measured (torch)")
    if len(pvm):
        pred = m.merge(pvm[["search", "N", "policy", "predicted_speedup"]], on=["search", "N", "policy"], how="left")
        ax.plot(x, pred["predicted_speedup"], "k_", markersize=18, markeredgewidth=2, linestyle="none",
                label="predicted (sim)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(x, labels, fontsize=7, rotation=90)
    ax.set_ylabel("speed-up over nonspec (makespan)")
    ax.legend(fontsize=7)
    return fig


def build(cells: pd.DataFrame, out: Path, budgets_s: Sequence[float] = DEFAULT_BUDGETS_S) -> Section:
    sec = Section("search_family", "Search family")  # the title the report prints
    df = family_cells(cells)
    if not len(df):
        sec.missing.append("Search family: no cells of +experiment=search_family "
                           "(python run.py -m +experiment=search_family)")
        return sec
    req = _requests(df)
    scaling = scaling_table(df, req)
    policies = policy_table(df, budgets_s, req)
    pvm = predicted_vs_measured(policies)
    if len(scaling):
        add_figure(sec, plot_scaling(scaling), out, "search_family_scaling", df)
        add_table(sec, scaling, out, "search_family_scaling", "Accuracy [95% Wilson] vs N per search and level "
                  "(nonspec), with generated tokens per problem and the cell's wall time")
        win = winners(scaling)
        if len(win):
            add_table(sec, win, out, "search_family_winners", "Most accurate search per level and N (measured); "
                      "clear = its lower 95% bound is above the runner-up's accuracy")
    if len(policies):
        add_figure(sec, plot_policies(pvm, policies), out, "search_family_policies", df)
        add_table(sec, policies, out, "search_family_policies", "Per search x policy: makespan speed-up over nonspec "
                  "(paired by seed) and correct answers per second whose service time is within each budget")
    if len(pvm):
        add_table(sec, pvm, out, "search_family_predicted", "Sim-predicted vs measured speed-up over nonspec "
                  f"(goal: within {SPEEDUP_GOAL:.0%})")
        sec.notes.append(f"Sim speed-ups within {SPEEDUP_GOAL:.0%} of the measured ones: "
                         f"{int(pvm['within_goal'].sum())} of {len(pvm)}; median |error| "
                         f"{pvm['speedup_error'].abs().median():.1%}, max {pvm['speedup_error'].abs().max():.1%}.")
    else:
        sec.missing.append("Search family: no search x policy cells on both engines to compare predicted with measured")
    return sec


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="The search-family section on its own: tables and figures")
    ap.add_argument("results_dir", help="the results store (its index), e.g. results/runs")
    ap.add_argument("--out", default=None, help="default: <results_dir>/report")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in DEFAULT_BUDGETS_S),
                    help="service-time budgets in seconds, comma-separated")
    args = ap.parse_args(argv)
    cells = C.prepare(load_index(args.results_dir))
    out = Path(args.out or Path(args.results_dir) / "report")
    sec = build(cells, out, [float(b) for b in args.budgets.split(",")])
    for caption, csv, md in sec.tables:
        print(f"\n{caption} ({csv})\n{md}")
    for line in sec.notes + sec.missing:
        print(line)
    for fig in sec.figures:
        print(f"figure: {fig}")
    return 0 if sec.drawn else 1


if __name__ == "__main__":
    raise SystemExit(main())
