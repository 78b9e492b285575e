"""`python -m analysis.fidelity --engine vllm`: does a profile of vLLM predict vLLM?

    python -m analysis.fidelity --engine vllm --profile profiled/cpu-vllm-tiny [--policies ...]
        [--beams 4,8] [--concurrency 4] [--workloads saturated] [--reps 3] [--n-problems 8]
        [--set KEY=VALUE ...] [--results-dir results]

vLLM samples with its own sampler and scheduler, so the sim cannot rebuild a vLLM run's
search tree, and the torch mode's check (same tree on both engines, the sim's own
schedule) does not apply. Instead the prediction replays vLLM's schedule: each cell runs
on ``engine=vllm`` ``--reps`` times (interleaved, as the torch mode's runs), and every
generation iteration and PRM batch of each run is predicted from its features by the
profile (``runners.profile_vllm``, fitted on other vLLM cells), the host gap after it by
the profile's host model; predicted makespan = predicted device + host seconds over the
replayed schedule + the run's measured idle time (``specscale.engine.vllm.replay``).
Per cell: generation / verification / other time and makespan, measured (median over the
runs, with the min-max spread) vs predicted (median over the same runs), with the
relative error; per policy the ratio to nonspec. Trees: n/a (replay).

Default grid (smaller than torch's: vLLM on the CPU is slow): policies nonspec, spec, ep,
ep_cd, full, fasttts x beam 4, 8 x concurrency 4 x saturated arrivals, seed 0, 8
problems, the tiny_vllm pair at the vLLM tests' settings (``VLLM_SET``).
Writes ``<results_dir>/fidelity/vllm/fidelity.csv`` (+ errors, ratios, scatter) and prints,
last, ``fidelity: N cells, median makespan error X%, max Y%, trees n/a (replay)``.
"""
from __future__ import annotations

import platform
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd
import yaml
from tqdm import tqdm

from analysis.fidelity_tables import cell_line, error_summary, scatter, write_run
from analysis.output import Section, add_figure, save_table
from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.engine.cost_profile import CostProfile
from specscale.engine.vllm.replay import Replay, call_table, measured, predict
from specscale.metrics.summary import summarize

SUBDIR = "fidelity/vllm"
DEFAULTS = {"policies": "nonspec,spec,ep,ep_cd,full,fasttts", "beams": "4,8", "concurrency": "4",
            "workloads": "saturated", "reps": 3, "n_problems": 8}
# Replay fields -> summary metric names (the torch mode's column names).
METRICS = {"makespan_s": "makespan_s", "time_generation_s": "generation_s", "time_verification_s": "verification_s",
           "time_other_s": "other_s"}
TREES = "n/a (replay)"


# The settings of the vLLM tests (tests/engine/vllm): the tiny_vllm pair, short steps and
# paths, a 512-token window, so a cell serves its problems in seconds on the CPU. Shared by
# the profiler and analysis.fidelity --engine vllm, so one pair of vLLM engines serves both.
VLLM_SET = ("engine=vllm", "model=tiny_vllm", "dataset=fixture_math500", "engine.max_model_len=512",
            "engine.kv_blocks=1024", "search.max_rounds=4", "search.step_token_cap=12", "search.path_token_cap=48",
            "expansion=2", "progress=false", "wandb.mode=disabled")


def run_replayed(overrides: Sequence[str]):
    """One vLLM cell: (recorder, summary, its calls with features: replay.call_table)."""
    server = build_server(compose_config(list(overrides), resolve=True))
    rec = server.run()
    table = call_table(rec, server.gen.iteration_features, server.backend.prm_engine.batches)
    return rec, summarize(rec, [60], 1), table


def vllm_device() -> str:
    import torch
    import vllm

    where = (torch.cuda.get_device_name() if torch.cuda.is_available() else
             f"CPU: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)")
    return f"vLLM {vllm.__version__} on {where}"


def load_profile(profile: str) -> CostProfile:
    """``profiled/<name>`` (a conf/hardware config) or the path of a profile YAML file."""
    path = Path(profile)
    hw = (yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") and path.is_file()
          else compose_config([f"hardware={profile}"], resolve=True)["hardware"])
    if "profile" not in hw:
        raise SystemExit(f"fidelity --engine vllm: {profile} has no profile (write one with runners.profile_vllm)")
    return CostProfile.from_dict(hw["profile"])


def compare(cell: Sequence[str], runs: Sequence[tuple[Replay, Replay, pd.DataFrame]]) -> dict:
    """One row of fidelity.csv: each run's measured seconds against the profile's
    prediction over that run's own schedule; medians over the runs."""
    row: dict = {"cell": " ".join(cell), "trees": TREES, "vllm_runs": len(runs),
                 "cost_model_extrapolated": int(statistics.median(p.extrapolated for _, p, _ in runs)),
                 "iterations": statistics.median(int((t["kind"] == "generate").sum()) for _, _, t in runs),
                 "prm_batches": statistics.median(int((t["kind"] == "verify").sum()) for _, _, t in runs)}
    for m, attr in METRICS.items():
        meas = [getattr(r, attr) for r, _, _ in runs]
        pred = statistics.median(getattr(p, attr) for _, p, _ in runs)
        med = statistics.median(meas)
        row[f"{m}_measured"] = med
        row[f"{m}_spread"] = (max(meas) - min(meas)) / med if med else 0.0
        row[f"{m}_predicted"] = pred
        row[f"{m}_rel_error"] = pred / med - 1.0 if med else float("nan")
    return row


def vllm_errors(df: pd.DataFrame) -> pd.DataFrame:
    """The torch mode's error summary over the replayed metrics; the spread is the vLLM runs'."""

    return error_summary(df, tuple(METRICS)).rename(columns={"median_torch_spread": "median_vllm_spread"})


def last_line(df: pd.DataFrame) -> str:
    err = df["makespan_s_rel_error"].abs()
    return (f"fidelity: {len(df)} cells, median makespan error {100 * err.median():.1f}%, "
            f"max {100 * err.max():.1f}%, trees {TREES}")


def summary_lines(df: pd.DataFrame) -> list[str]:
    dev = (df["time_generation_s_rel_error"].abs() + df["time_verification_s_rel_error"].abs()) / 2
    err = df["makespan_s_rel_error"].abs()
    return [f"  vLLM (replay of its own schedule): {len(df)} cells, makespan error median "
            f"{100 * err.median():.1f}% (max {100 * err.max():.1f}%), "
            f"device time error median {100 * dev.median():.1f}%, vLLM runs' makespan spread median "
            f"{100 * df['makespan_s_spread'].median():.0f}%"]


def main(args, common: Sequence[str], cells: Sequence[list[str]], contexts: Sequence[tuple[str, str]]) -> int:
    """Run the grid (``cells``: overrides per cell; ``contexts``: (context, policy) per cell)."""

    profile = load_profile(args.profile)
    runs: list[list] = [[] for _ in cells]
    checked = False
    with tqdm(total=len(cells) * args.reps, desc="fidelity: vLLM runs", unit="run", file=sys.stdout) as bar:
        for _ in range(args.reps):  # interleaved: a slow stretch costs one run of several cells
            for out, cell in zip(runs, cells):
                _, s, table = run_replayed([*common, *cell])
                if not checked:  # the engines are up: the device string is final
                    profile.check_device(vllm_device())
                    checked = True
                out.append((measured(s), predict(profile, table, s["time_idle_s"]), table))
                bar.update()
    rows = []
    for i, (cell, (ctx, pol), r) in enumerate(zip(cells, contexts, runs), 1):
        row = compare(cell, r)
        row.update(context=ctx, policy=pol)
        rows.append(row)
        print(cell_line(i, len(cells), row, f"trees {TREES}"), flush=True)
    df = pd.DataFrame(rows)
    write_run(df, Path(args.results_dir) / SUBDIR, vllm_errors(df),
              scatter(df, "measured makespan (s, median of vLLM runs)", "replayed prediction (s)"), summary_lines(df))
    print(last_line(df))
    return 0


def add_to_section(sec: Section, results_dir: Optional[Path], out: Path) -> None:
    """The vLLM rows of the report's fidelity section, when a vLLM run is in results_dir."""

    src = Path(results_dir) / SUBDIR / "fidelity.csv" if results_dir is not None else None
    if src is None or not src.is_file():
        # Optional (engine=vllm is an extra): a note, not a missing figure.
        sec.notes.append(f"{sec.title}: no vLLM fidelity run (python -m analysis.fidelity --engine vllm "
                            "--profile profiled/<name> --results-dir <dir>)")
        return
    df = pd.read_csv(src)
    add_figure(sec, scatter(df, "measured makespan (s, median of vLLM runs)", "replayed prediction (s)"), out,
               "fidelity_vllm_scatter", numbers="simulated (the engine's replayed trees) against measured: vLLM on CPU")
    tables = Path(out) / "tables"
    cols = ["cell", "trees", "makespan_s_measured", "makespan_s_spread", "makespan_s_predicted", "makespan_s_rel_error"]
    csv, md = save_table(df[cols], tables, "fidelity_vllm")
    sec.tables.append(("vLLM: makespan measured vs predicted by its profile over each run's own schedule "
                       "(trees n/a, replay)", csv, md))
    csv, md = save_table(vllm_errors(df), tables, "fidelity_vllm_errors")
    sec.tables.append(("vLLM: error per metric over the cells, beside the spread of repeated vLLM runs", csv, md))
    sec.notes.extend([*summary_lines(df), last_line(df)])
