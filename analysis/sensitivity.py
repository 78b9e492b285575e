"""`python -m analysis.sensitivity`: how the sim's policy ratios depend on its constants.

    python -m analysis.sensitivity [--engine sim] [--n-problems 64] [--beam 8] [--jobs 2]
        [--results-dir results/runs] [--skip-tornado] [--skip-overhead]

Two studies on the Fig. 13 cells (Qwen2.5-7B, MATH-500, A100, saturated, one beam):

* **Tornado**: each fitted constant
  of ``SIM_PARAMS`` at 0.5x and 1.5x its profile value (clipped to its bounds), all
  others fixed -> the change of full/nonspec, ep_cd/ep and full/fasttts (`output_tok_s`
  ratios). The widest bars are the constants a reader should distrust first.
* **Engine efficiency** (Deliver 5, a result the paper does not have): the per-iteration
  overheads (``gen_iteration_overhead_s`` and ``host_iteration_s``) scaled from 0 (an
  ideal roofline engine) to 1x (the profile's value) and beyond, under both the
  calibrated and the roofline profile -> how much of SpecScale's gain over nonspec
  depends on how slow each engine iteration is.

Writes ``<results_dir>/sensitivity/{tornado,overhead}.csv`` and figures; the report's
"Sensitivity" section shows them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis.output import Section, add_figure, new_figure, save_figure, save_table, side_run_table
from specscale.calibration.evaluate import Evaluator
from specscale.calibration.params import SIM_PARAMS
from specscale.calibration.targets import cell
from specscale.compose import compose_config

SUBDIR = "sensitivity"
RATIOS = (("full", "nonspec"), ("ep_cd", "ep"), ("full", "fasttts"))
OVERHEAD_KEYS = ("cost.gen_iteration_overhead_s", "cost.host_iteration_s")
OVERHEAD_SCALES = (0.0, 0.25, 0.5, 1.0, 2.0)


def profile_value(engine: str, key: str) -> float:
    node = compose_config([f"engine={engine}"], resolve=True)["engine"]
    for part in key.split("."):
        node = node[part]
    return float(node)


def ratios(ev: Evaluator, beam: int, overrides: Sequence[str]) -> dict[str, float]:
    cells = {p: cell(p, beam) for p in {p for pair in RATIOS for p in pair}}
    s = ev.summaries(cells.values(), overrides)
    return {f"{a}/{b}": s[cells[a].name]["output_tok_s"] / s[cells[b].name]["output_tok_s"] for a, b in RATIOS}


def tornado(ev: Evaluator, engine: str, beam: int) -> pd.DataFrame:
    base = ratios(ev, beam, ())
    rows = []
    for p in SIM_PARAMS:
        v0 = profile_value(engine, p.key)
        for factor in (0.5, 1.5):
            v = min(max(v0 * factor, p.low), p.high)
            got = ratios(ev, beam, [f"engine.{p.key}={v!r}"])
            for name, r in got.items():
                rows.append({"constant": p.key, "factor": factor, "value": v, "profile_value": v0, "ratio": name,
                             "base": base[name], "perturbed": r, "change_pct": 100.0 * (r / base[name] - 1.0)})
    return pd.DataFrame(rows)


def overhead(ev_by_engine: dict[str, Evaluator], beam: int,
             scales: Sequence[float] = OVERHEAD_SCALES) -> pd.DataFrame:
    rows = []
    for engine, ev in ev_by_engine.items():
        v0 = {k: profile_value(engine, k) for k in OVERHEAD_KEYS}
        for scale in scales:
            got = ratios(ev, beam, [f"engine.{k}={v * scale!r}" for k, v in v0.items()])
            for name, r in got.items():
                rows.append({"profile": engine, "overhead_scale": scale, **{k.split(".")[-1]: v * scale
                                                                             for k, v in v0.items()},
                             "ratio": name, "value": r})
    return pd.DataFrame(rows)


def tornado_figure(df: pd.DataFrame):
    names = list(dict.fromkeys(df["ratio"]))
    fig, axes = new_figure(ncols=len(names), width=4.6, height=3.4)
    for ax, name in zip(axes, names):
        g = df[df["ratio"] == name]
        span = g.groupby("constant")["change_pct"].agg(["min", "max"])
        span = span.reindex((span["max"] - span["min"]).sort_values().index)
        y = range(len(span))
        ax.barh(list(y), span["max"] - span["min"], left=span["min"], color="tab:blue", alpha=0.7)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(list(y), [c.split(".")[-1] for c in span.index], fontsize=7)
        ax.set_xlabel("change of the ratio (%)", fontsize=8)
        ax.set_title(f"{name}: constants x0.5 / x1.5", fontsize=9)
    return fig


def overhead_figure(df: pd.DataFrame):
    names = list(dict.fromkeys(df["ratio"]))
    fig, axes = new_figure(ncols=len(names), width=4.2, height=3.4)
    for ax, name in zip(axes, names):
        for prof, g in df[df["ratio"] == name].groupby("profile"):
            ax.plot(g["overhead_scale"], g["value"], marker="o", label=prof)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("per-iteration overheads (x profile value)", fontsize=8)
        ax.set_ylabel(name, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("Policy ratios as per-iteration overheads shrink to zero", fontsize=10)
    return fig


def build_section(results_dir: Optional[Path], out: Path) -> Section:
    sec = Section("sensitivity", "Sensitivity and engine efficiency")
    probe = Section(sec.key, sec.title)  # collects "not run" lines; reported only if neither study ran
    for name, fig_of, caption in (("tornado", tornado_figure, "Each fitted constant x0.5 / x1.5: change of the "
                                   "policy ratios (output_tok_s)"),
                                  ("overhead", overhead_figure, "Policy ratios vs per-iteration overheads, "
                                   "calibrated and roofline profiles")):
        df = side_run_table(results_dir, SUBDIR, name, probe, "python -m analysis.sensitivity --results-dir <dir>")
        if df is None:
            continue
        add_figure(sec, fig_of(df), out, f"sensitivity_{name}",
                   numbers="simulated (roofline a100, calibrated), one constant moved at a time")
        csv, md = save_table(df, Path(out) / "tables", f"sensitivity_{name}")
        sec.tables.append((caption, csv, md))
    if not sec.tables:
        sec.missing.append(probe.missing[0])
    return sec


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="sim")
    ap.add_argument("--n-problems", type=int, default=64)
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results-dir", default="results/runs")
    ap.add_argument("--skip-tornado", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.results_dir) / SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    kw = dict(n_problems=args.n_problems, seeds=(args.seed,), jobs=args.jobs)
    with Evaluator(base=(f"engine={args.engine}",), **kw) as ev:
        if not args.skip_tornado:
            df = tornado(ev, args.engine, args.beam)
            save_table(df, out, "tornado")
            save_figure(tornado_figure(df), out, "tornado")
            print(df.groupby(["ratio", "constant"])["change_pct"].agg(["min", "max"]).round(1).to_string())
        if not args.skip_overhead:
            with Evaluator(base=("engine=sim_roofline",), **kw) as roof:
                engines = {args.engine: ev} if args.engine == "sim_roofline" else {args.engine: ev,
                                                                                    "sim_roofline": roof}
                df = overhead(engines, args.beam)
            save_table(df, out, "overhead")
            save_figure(overhead_figure(df), out, "overhead")
            print(df.pivot_table(index=["profile", "overhead_scale"], columns="ratio", values="value").round(3)
                  .to_string())
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
