"""`python -m analysis.fidelity`: does the sim, on a measured profile, predict the engine?

With ``--engine vllm``: vLLM's own schedule replayed on a vLLM profile (trees n/a; see
``analysis.fidelity_vllm``). The torch mode:

    python -m analysis.fidelity --profile profiled/cpu-tiny [--policies nonspec,spec,ep,ep_cd,full,fasttts]
        [--beams 4,8,16] [--concurrency 4,16] [--workloads saturated,poisson] [--reps 3]
        [--n-problems 16] [--set KEY=VALUE ...] [--results-dir results/runs]

Each cell runs on ``engine=torch`` in synthetic-token mode (real forwards, tokens and
scores from the synthetic workload) ``--reps`` times, and once on ``engine=sim`` with
``hardware=<profile>``, with the same seed, workload and KV pools (``engine.kv_blocks``,
``engine.prm_kv_blocks``), so the two build the same search tree (checked: rounds,
members, texts, selections and scores). Per cell: makespan, generation / verification /
other time, PRM batches, peak KV blocks and p50/p99 latency, measured (median over the
torch runs, with its min-max spread so noise is not read as model error) vs predicted,
with the relative error; per policy the makespan ratio to nonspec, measured vs
predicted. Writes ``<results_dir>/fidelity/fidelity.csv`` and prints, last,
``fidelity: N cells, median makespan error X%, max Y%, trees identical K/N``.
None of these cells is used to build the profile (``runners.profile_engine`` times
micro-batches only).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd
import yaml
from tqdm import tqdm

from analysis.output import Section, add_figure, save_table, side_run_table
from analysis import fidelity_vllm
from analysis.fidelity_tables import METRICS, cell_line, error_summary, policy_ratios, scatter, write_run
from analysis.fidelity_vllm import VLLM_SET
from specscale.engine.torch.profiler import SHORT_SEARCH, scheduler_limits, speed_probe
from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.metrics.summary import summarize

SUBDIR = "fidelity"
# Wall-clock metrics the machine's speed scales (the speed-adjusted reading applies to these).
TIMED = ("makespan_s", "time_generation_s", "time_verification_s", "time_other_s")
TREE_COLS = ("request_id", "round", "member_keys", "member_texts", "member_terminal", "selected_keys",
             "member_scores")
# Short steps and paths: the tiny pair runs a many-round search in seconds (as the synthetic-token tests).
# The torch mode's default grid; > 4 problems: concurrency 4 queues, 16 does not.
TORCH_DEFAULTS = {"policies": "nonspec,spec,ep,ep_cd,full,fasttts", "beams": "4,8,16", "concurrency": "4,16",
                  "workloads": "saturated,poisson", "reps": 3, "n_problems": 16}
DEFAULT_SET = ("model=tiny", "dataset=fixture_math500", *SHORT_SEARCH,
               "engine.kv_blocks=4096", "engine.prm_kv_blocks=1024", "progress=false", "wandb.mode=disabled")


def tree(rec) -> pd.DataFrame:
    df = pd.DataFrame(rec.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)
    return df[list(TREE_COLS)].astype(str)


def run(overrides: Sequence[str], hardware: Optional[dict] = None):
    cfg = compose_config(list(overrides), resolve=True)
    if hardware is not None:  # a profile given as a file rather than a conf/hardware name
        cfg["hardware"] = hardware
    rec = build_server(cfg).run()
    return rec, summarize(rec, [60], 1)


def torch_run(overrides: Sequence[str]):
    """A torch run with the speed probe timed before and after it (``runners.profile_engine``):
    (record, summary, probe seconds). The probe writes only free KV blocks before the run and
    after it, so the run itself is untouched (its tree is compared with the sim's)."""
    server = build_server(compose_config(list(overrides), resolve=True))
    runner, prm = server.backend.runner, server.backend.prm
    before = speed_probe(runner, prm)
    rec = server.run()
    return rec, summarize(rec, [60], 1), (before + speed_probe(runner, prm)) / 2


def profile_probe_s(profile: str) -> Optional[float]:
    """The speed probe's seconds when the profile was measured (None: an older profile)."""
    if Path(profile).suffix in (".yaml", ".yml") and Path(profile).is_file():
        hw = yaml.safe_load(Path(profile).read_text())
    else:
        hw = compose_config([f"hardware={profile}"], resolve=True)["hardware"]
    probe = ((hw.get("profile") or {}).get("meta") or {}).get("probe_s")
    return float(probe) if probe else None


def torch_overrides(cell: Sequence[str], common: Sequence[str]) -> list[str]:
    return ["engine=torch", "engine.synthetic_tokens=true", *common, *cell]


def sim_run(cell: Sequence[str], common: Sequence[str], profile: str):
    overrides = ["engine=sim", *common, *scheduler_limits(torch_overrides(cell, common)), *cell]
    if Path(profile).suffix in (".yaml", ".yml") and Path(profile).is_file():
        return run(overrides, yaml.safe_load(Path(profile).read_text()))
    return run([*overrides, f"hardware={profile}"])


def compare(cell: Sequence[str], measured: Sequence[tuple], sim_rec, sim: dict,
            ref_probe: Optional[float] = None) -> dict:
    """One row of fidelity.csv: the torch runs (tree, summary, probe seconds) against the
    sim's. With the profile's probe time, each run's timings are also read at the speed the
    machine had when profiled (divided by its probe ratio): ``*_rel_error_speed_adjusted``."""
    sim_tree = tree(sim_rec)
    row: dict = {"cell": " ".join(cell), "trees_identical": all(t.equals(sim_tree) for t, *_ in measured),
                 "cost_model_extrapolated": sim.get("cost_model_extrapolated"), "torch_runs": len(measured)}
    ratios = [p / ref_probe for *_, p in measured] if ref_probe else None
    row["probe_ratio"] = statistics.median(ratios) if ratios else float("nan")
    row["probe_ratio_spread"] = (max(ratios) - min(ratios)) / row["probe_ratio"] if ratios else float("nan")
    for m in METRICS:
        vals = [s[m] for _, s, *_ in measured]
        med = statistics.median(vals)
        row[f"{m}_measured"] = med
        row[f"{m}_spread"] = (max(vals) - min(vals)) / med if med else 0.0
        row[f"{m}_predicted"] = sim[m]
        row[f"{m}_rel_error"] = sim[m] / med - 1.0 if med else float("nan")
    for m in TIMED:
        if ratios:
            # Idle stretches (waiting for Poisson arrivals) take the same time at any speed:
            # only the makespan's busy part is read at the profiled speed.
            idle = [s["time_idle_s"] if m == "makespan_s" else 0.0 for _, s, *_ in measured]
            adj = statistics.median((s[m] - i) / r + i for (_, s, *_), r, i in zip(measured, ratios, idle))
            row[f"{m}_rel_error_speed_adjusted"] = sim[m] / adj - 1.0 if adj else float("nan")
        else:
            row[f"{m}_rel_error_speed_adjusted"] = float("nan")
    return row


def workload_lines(df: pd.DataFrame) -> list[str]:
    """Per arrival workload: a Poisson cell's makespan is mostly its arrival window (the
    same on both engines), so its error says little; saturated cells are read apart."""
    out = []
    for wl, g in df.groupby(df["cell"].str.extract(r"workload=(\S+)", expand=False)):
        err, dev = g["makespan_s_rel_error"].abs(), (g["time_generation_s_rel_error"].abs()
                                                     + g["time_verification_s_rel_error"].abs()) / 2
        line = (f"  {wl}: {len(g)} cells, makespan error median {100 * err.median():.1f}% (max "
                f"{100 * err.max():.1f}%), device time error median {100 * dev.median():.1f}%, torch runs' "
                f"makespan spread median {100 * g['makespan_s_spread'].median():.0f}%")
        adj = g.get("makespan_s_rel_error_speed_adjusted")
        if adj is not None and adj.notna().any():
            line += (f"; at the profiled speed (probe ratio median {g['probe_ratio'].median():.2f}): makespan "
                     f"error median {100 * adj.abs().median():.1f}% (max {100 * adj.abs().max():.1f}%)")
        out.append(line)
    return out


def last_line(df: pd.DataFrame) -> str:
    err = df["makespan_s_rel_error"].abs()
    return (f"fidelity: {len(df)} cells, median makespan error {100 * err.median():.1f}%, "
            f"max {100 * err.max():.1f}%, trees identical {int(df['trees_identical'].sum())}/{len(df)}")


def build_section(results_dir: Optional[Path], out: Path) -> Section:
    sec = Section("fidelity", "Fidelity (sim on a measured profile vs the engine)")
    fidelity_vllm.add_to_section(sec, results_dir, out)  # vLLM: its own schedule replayed on its profile
    df = side_run_table(results_dir, SUBDIR, "fidelity", sec,
                        "python -m analysis.fidelity --profile profiled/<name> --results-dir <dir>")
    if df is None:
        return sec
    add_figure(sec, scatter(df), out, "fidelity_scatter",
               numbers="simulated (a profile of this machine) against measured: torch on the same machine")
    cols = ["cell", "trees_identical", "makespan_s_measured", "makespan_s_spread", "makespan_s_predicted",
            "makespan_s_rel_error"]
    tables = Path(out) / "tables"
    csv, md = save_table(df[cols], tables, "fidelity")
    sec.tables.append(("Makespan measured (torch, synthetic tokens) vs predicted (sim on the profile)", csv, md))
    csv, md = save_table(error_summary(df), tables, "fidelity_errors")
    sec.tables.append(("Error per metric over the cells, beside the spread of repeated torch runs", csv, md))
    ratios = policy_ratios(df) if "policy" in df else pd.DataFrame()
    if len(ratios):
        csv, md = save_table(ratios, tables, "fidelity_ratios")
        sec.tables.append(("Each policy's makespan over nonspec's, measured vs predicted", csv, md))
    sec.notes.extend([*workload_lines(df), last_line(df)])
    return sec


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="hardware config of the profile (e.g. profiled/cpu-tiny) "
                    "or the path of its YAML file")
    ap.add_argument("--engine", default="torch", choices=("torch", "vllm"), help="torch: same trees, the sim's "
                    "schedule; vllm: vLLM's own schedule replayed on its profile (analysis.fidelity_vllm)")
    # Defaults per engine (None here): TORCH_DEFAULTS, or fidelity_vllm.DEFAULTS (a smaller grid).
    ap.add_argument("--policies", default=None)
    ap.add_argument("--beams", default=None)
    ap.add_argument("--concurrency", default=None)
    ap.add_argument("--workloads", default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--n-problems", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="extra override for both engines (repeatable)")
    ap.add_argument("--results-dir", default="results/runs")
    args = ap.parse_args(argv)
    if args.engine == "vllm":

        defaults, base = fidelity_vllm.DEFAULTS, VLLM_SET
    else:
        defaults, base = TORCH_DEFAULTS, DEFAULT_SET
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    common = [*base, f"n_problems={args.n_problems}", f"seed={args.seed}", *args.set]
    grid = list(itertools.product(args.workloads.split(","), [int(b) for b in args.beams.split(",")],
                                  [int(c) for c in args.concurrency.split(",")], args.policies.split(",")))
    cells = [[f"workload={wl}", f"beam={beam}", f"concurrency={conc}", f"policy={pol}"]
             for wl, beam, conc, pol in grid]
    if args.engine == "vllm":
        return fidelity_vllm.main(args, common, cells, [(f"{wl} b{beam} c{conc}", pol) for wl, beam, conc, pol in grid])
    # Repetitions interleaved (every cell once per round): a slow stretch of a shared machine
    # then costs one run of several cells, which the median drops, not all runs of one cell.
    ref_probe = profile_probe_s(args.profile)
    measured: list[list] = [[] for _ in cells]
    with tqdm(total=len(cells) * args.reps, desc="fidelity: torch runs", unit="run", file=sys.stdout) as bar:
        for _ in range(args.reps):
            for runs, cell in zip(measured, cells):
                rec, s, probe = torch_run(torch_overrides(cell, common))
                runs.append((tree(rec), s, probe))
                bar.update()
    rows = []
    for i, ((wl, beam, conc, pol), cell, runs) in enumerate(zip(grid, cells, measured), 1):
        row = compare(cell, runs, *sim_run(cell, common, args.profile), ref_probe=ref_probe)
        row.update(context=f"{wl} b{beam} c{conc}", policy=pol)
        rows.append(row)
        print(cell_line(i, len(grid), row, "tree " + ("same" if row["trees_identical"] else "DIFFERS")), flush=True)
    df = pd.DataFrame(rows)
    write_run(df, Path(args.results_dir) / SUBDIR, error_summary(df), scatter(df), workload_lines(df))
    print(last_line(df))
    return 0 if df["trees_identical"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
