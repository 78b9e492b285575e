"""The fidelity record's tables, figure and files, shared by both modes of the fidelity
check (analysis/fidelity.py: torch against the sim; analysis/fidelity_vllm.py: vLLM against
its replayed schedule)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis.output import new_figure, save_figure, save_table, to_markdown
from analysis.plots import identity_scatter

METRICS = ("makespan_s", "time_generation_s", "time_verification_s", "time_other_s", "prm_invocations",
           "kv_peak_blocks", "latency_p50_s", "latency_p99_s")


RUNS_SEP = ";"  # the makespan_s_runs column: one cell's runs in repetition order


def runs_column(values: Sequence[float]) -> str:
    """A cell's measured makespans, one per repetition in order (``makespan_s_runs``)."""
    return RUNS_SEP.join(f"{v:.9g}" for v in values)


def _runs(row) -> list[float] | None:
    v = row.get("makespan_s_runs")
    return [float(x) for x in v.split(RUNS_SEP)] if isinstance(v, str) and v else None


def policy_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell context, each policy's makespan over nonspec's: measured vs predicted.

    Measured, where both cells record their runs (``makespan_s_runs``, repetitions in the
    same order): the median over repetitions of the run's makespan over nonspec's run of
    the same repetition (``paired``). The torch check runs a context's cells back to back
    in each repetition, so a slow stretch of a shared machine slows both runs of a pair and
    drops out of their ratio, where a ratio of medians would mix stretches. Otherwise the
    ratio of the medians."""
    rows = []
    for ctx, g in df.groupby("context"):
        base = g[g["policy"] == "nonspec"]
        if not len(base):
            continue
        b = base.iloc[0]
        for _, r in g.iterrows():
            runs, base_runs = _runs(r), _runs(b)
            paired = bool(runs and base_runs and len(runs) == len(base_runs))
            meas = (statistics.median(x / y for x, y in zip(runs, base_runs)) if paired
                    else r["makespan_s_measured"] / b["makespan_s_measured"])
            pred = r["makespan_s_predicted"] / b["makespan_s_predicted"]
            rows.append({"context": ctx, "policy": r["policy"], "measured_vs_nonspec": meas,
                         "predicted_vs_nonspec": pred, "rel_error": pred / meas - 1.0, "paired": paired})
    return pd.DataFrame(rows)


def scatter(df: pd.DataFrame, xlabel: str = "measured makespan (s, median of torch runs)",
            ylabel: str = "sim prediction (s)"):
    fig, (ax,) = new_figure(width=5.4, height=4.8)
    identity_scatter(ax, {str(p): (g["makespan_s_measured"].tolist(), g["makespan_s_predicted"].tolist())
                          for p, g in df.groupby("policy")})
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("Does the sim predict the engine's makespan?", fontsize=9)
    return fig


def error_summary(df: pd.DataFrame, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Per metric: median and max |relative error| over the cells, and the median spread of
    the measured runs (the noise floor an error should be read against)."""
    rows = []
    for m in metrics:
        err = df[f"{m}_rel_error"].abs()
        adj = df.get(f"{m}_rel_error_speed_adjusted")
        rows.append({"metric": m, "median_abs_error": err.median(), "max_abs_error": err.max(),
                     "median_signed_error": df[f"{m}_rel_error"].median(),
                     "median_torch_spread": df[f"{m}_spread"].median(),
                     "median_abs_error_speed_adjusted": adj.abs().median() if adj is not None else float("nan")})
    return pd.DataFrame(rows)


def cell_line(i: int, n: int, row: dict, trees: str) -> str:
    """The progress line of one finished cell (torch and vLLM modes)."""
    return (f"[{i}/{n}] {row['cell']}: makespan measured {row['makespan_s_measured']:.3f} s "
            f"(spread {100 * row['makespan_s_spread']:.0f}%), predicted {row['makespan_s_predicted']:.3f} s "
            f"({100 * row['makespan_s_rel_error']:+.1f}%), {trees}")


def write_run(df: pd.DataFrame, out: Path, errors: pd.DataFrame, fig, summary: Sequence[str]) -> None:
    """A fidelity run's files (cells, errors, policy ratios, scatter) in ``out``, and its
    tables and summary lines printed (torch and vLLM modes)."""
    out.mkdir(parents=True, exist_ok=True)
    save_table(df, out, "fidelity")
    save_table(errors, out, "fidelity_errors")
    ratios = policy_ratios(df)
    save_table(ratios, out, "fidelity_ratios")
    save_figure(fig, out, "fidelity_scatter")
    print(to_markdown(errors))
    if len(ratios):
        print(to_markdown(ratios))
    print(*summary, sep="\n")
