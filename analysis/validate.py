"""`python -m analysis.validate`: the sim's predictions of every held-out paper number.

    python -m analysis.validate [--engine sim] [--n-problems 500] [--seed 0] [--jobs 2]
        [--results-dir results/runs]

Runs the cells of ``specscale.calibration.targets.VALIDATION`` (never used to fit or to
choose anything) under an engine profile (default: the calibrated ``engine=sim``; try
``engine=sim_roofline`` for the hand-set guesses) at paper scale (500 problems, as
MATH-500), and writes ``<results_dir>/validation/validation.csv|.md`` and a
predicted-vs-paper scatter with the y = x line. Each target: predicted, paper, relative
error, its rule (±15% for numbers; an ordering or bound for qualitative claims) and
whether it holds. ``python -m analysis.report`` shows the latest table in its
"Validation" section. Misses are reported as misses.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis.output import Section, add_figure, new_figure, save_figure, save_table, side_run_table, to_markdown
from analysis.plots import identity_scatter
from specscale.calibration.evaluate import Evaluator, table
from specscale.calibration.targets import NOT_PRODUCED, VALIDATION, Target, cells_of

SUBDIR = "validation"


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def validation_table(targets: Sequence[Target], predicted: Sequence[float]) -> pd.DataFrame:
    return pd.DataFrame(table(targets, predicted))


def headline(df: pd.DataFrame) -> str:
    numeric = df[df["rule"].str.startswith("±")]
    other = df[~df["rule"].str.startswith("±")]
    return (f"{int(numeric['pass'].sum())}/{len(numeric)} numeric held-out targets within their tolerance "
            f"({100 * numeric['pass'].mean():.0f}%); {int(other['pass'].sum())}/{len(other)} orderings and bounds "
            "hold" if len(numeric) else "no numeric targets")


def scatter(df: pd.DataFrame):
    """Predicted vs paper for the numeric targets (log-log, y = x and ±15% lines)."""
    num = df[df["rule"].str.startswith("±")]
    num = num[num["predicted"].apply(lambda v: isinstance(v, float) and math.isfinite(v) and v > 0)]
    fig, (ax,) = new_figure(width=5.6, height=5.0)
    identity_scatter(ax, {str(u) or "-": (g["paper"].astype(float).tolist(), g["predicted"].tolist())
                          for u, g in num.groupby("unit")}, band=0.15, margin=1.3)
    ax.set_xlabel("paper")
    ax.set_ylabel("sim prediction")
    ax.set_title("Held-out targets: sim vs paper (dashed: ±15%)", fontsize=9)
    return fig


def write(df: pd.DataFrame, meta: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, _ = save_table(df, out_dir, "validation")
    save_figure(scatter(df), out_dir, "validation_scatter")
    (out_dir / "validation.json").write_text(json.dumps({**meta, "headline": headline(df)}, indent=1))
    return csv


def build_section(results_dir: Optional[Path], out: Path) -> Section:
    """The report's section: the table and scatter of the last `analysis.validate` run."""
    sec = Section("validation", "Validation (held-out paper numbers)")
    df = side_run_table(results_dir, SUBDIR, "validation", sec, "python -m analysis.validate --results-dir <dir>")
    if df is None:
        return sec
    src = Path(results_dir) / SUBDIR / "validation.csv"
    meta_path = src.with_name("validation.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    add_figure(sec, scatter(df), out, "validation_scatter")
    csv, md = save_table(df, Path(out) / "tables", "validation")
    sec.tables.append((f"Held-out targets, {meta.get('profile', '?')} profile, n_problems={meta.get('n_problems')}",
                       csv, md))
    sec.notes.append(headline(df) + ".")
    for fig, why in NOT_PRODUCED.items():
        sec.notes.append(f"Not validated: {fig} ({why}).")
    return sec


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="sim", help="engine profile: sim (calibrated) or sim_roofline")
    ap.add_argument("--n-problems", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results-dir", default="results/runs")
    args = ap.parse_args(argv)
    cells = cells_of(VALIDATION)
    print(f"validation: {len(VALIDATION)} held-out targets over {len(cells)} sim cells, engine={args.engine}, "
          f"n_problems={args.n_problems}", flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    with Evaluator(n_problems=args.n_problems, seed=args.seed, jobs=args.jobs, base=(f"engine={args.engine}",),
                   progress=True) as ev:
        predicted = ev.predict(VALIDATION)
    df = validation_table(VALIDATION, predicted)
    # CPU seconds of this process and its (joined) workers: what the sweep costs on a
    # quiet machine, whatever else shared the cores while it ran.
    meta = {"profile": args.engine, "n_problems": args.n_problems, "seed": args.seed, "jobs": args.jobs,
            "wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0, "cells": len(cells)}
    csv = write(df, meta, Path(args.results_dir) / SUBDIR)
    print(to_markdown(df.drop(columns=["source"])))
    print(f"\n{headline(df)}; {meta['wall_s']:.0f} s wall, {meta['cpu_s']:.0f} CPU s for {len(cells)} cells. "
          f"Wrote {csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
