"""`python -m analysis.fidelity`: does the sim, on a measured profile, predict the engine?

With ``--engine vllm``: vLLM's own schedule replayed on a vLLM profile (trees n/a; see
``analysis.fidelity_vllm``). The torch mode:

    python -m analysis.fidelity --profile profiled/cpu-tiny [--policies nonspec,spec,ep,ep_cd,full,fasttts]
        [--shapes 4/2/4/16,...] [--workloads saturated,poisson] [--reps 3] [--rescale-to-probe]
        [--set KEY=VALUE ...] [--results-dir results/runs]
        (or a product grid: [--beams 4,8,16] [--concurrency 4,16] [--n-problems 16], expansion 2)

Each cell runs on ``engine=torch`` in synthetic-token mode (real forwards, tokens and
scores from the synthetic workload) ``--reps`` times, and once on ``engine=sim`` with
``hardware=<profile>``, with the same seed, workload and KV pools (``engine.kv_blocks``,
``engine.prm_kv_blocks``), so the two build the same search tree (checked: rounds,
members, texts, selections and scores). Per cell: makespan, generation / verification /
other time, PRM batches, peak KV blocks and p50/p99 latency, measured (median over the
torch runs, with its min-max spread so noise is not read as model error) vs predicted,
with the relative error; per policy the makespan ratio to nonspec, measured vs
predicted. Two further readings of the timings: at the speed the machine had when
profiled (each run divided by its own probe ratio), and, with ``--rescale-to-probe``, the
sim on the profile rescaled to this machine's probe (``engine.rescale_to_probe=true``).
With ``--pressure``, cells where waiting has its price on the engine too (``PRESSURE``: KV
preemption, a binding row cap, each lazy-verification trigger), read apart; and for every
cell the PRM seconds per batch trigger, measured vs predicted, summed up per trigger kind.
Writes ``<results_dir>/fidelity/fidelity.csv``, prints one line per workload (saturated
cells are the evidence; a Poisson cell's makespan is mostly its arrival window unless the
rate keeps the engine busy) and, last, ``fidelity: N cells (saturated S: median makespan
error X%, max Y%; poisson P: ...), trees identical K/N``.
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
from analysis.fidelity_tables import (METRICS, cell_line, error_summary, policy_ratios, runs_column, scatter,
                                     write_run)
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
TORCH_DEFAULTS = {"policies": "nonspec,spec,ep,ep_cd,full,fasttts", "workloads": "saturated,poisson", "reps": 3}
# The torch mode's default shapes, beam/expansion/concurrency/problems: expansions 2 and 4,
# beams 4 to 16 (6 and 12 too), 6 to 32 problems, queues that do and do not form, so no
# single shape dominates the error. --beams/--concurrency/--n-problems (expansion 2) give a
# plain product grid instead.
SHAPES = "4/2/4/16,6/2/3/6,8/4/16/32,12/4/8/12,16/4/16/24,8/2/4/8"
# --pressure: saturated cells (beam 8, concurrency 8, 12 problems) where each mechanism of
# waiting fires on the torch engine: a KV pool small enough to preempt, a row cap that
# binds, and each lazy-verification trigger made the one that fires most.
# (label, expansion, policies, overrides)
PRESSURE = (("kv pool 110 blocks", 2, ("nonspec", "full"), ("engine.kv_blocks=110",)),
            ("row cap 8", 2, ("nonspec", "full"), ("engine.max_num_seqs=8",)),
            ("lv tokens: b_max 128", 4, ("full",), ("policy.b_max=128",)),
            ("lv deferrals: d_max 1, no sibling trigger", 4, ("full",), ("policy.d_max=1", "policy.sibling_trigger=false")),
            ("lv siblings: full as configured", 4, ("full",), ()))
PRESSURE_METRICS = ("preemptions", "row_cap_bound_share")
DEFAULT_SET = ("model=tiny", "dataset=fixture_math500", *SHORT_SEARCH,
               "engine.kv_blocks=4096", "engine.prm_kv_blocks=1024", "progress=false", "wandb.mode=disabled")


def tree(rec) -> pd.DataFrame:
    df = pd.DataFrame(rec.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)
    return df[list(TREE_COLS)].astype(str)


TRIGGER_PREFIX = "verify_s:"  # summary keys added here: PRM seconds per batch trigger


def summarize_run(rec) -> dict:
    """The run's summary, plus its PRM batches' seconds per trigger (siblings, tokens,
    deferrals, barrier, ...): where verification time comes from, read per trigger kind."""
    out = summarize(rec, [60], 1)
    for it in rec.iterations:
        if it["kind"] == "verify":
            key = f"{TRIGGER_PREFIX}{it['trigger']}"
            out[key] = out.get(key, 0.0) + it["seconds"]
    return out


def run(overrides: Sequence[str], hardware: Optional[dict] = None):
    cfg = compose_config(list(overrides), resolve=True)
    if hardware is not None:  # a profile given as a file rather than a conf/hardware name
        cfg["hardware"] = hardware
    rec = build_server(cfg).run()
    return rec, summarize_run(rec)


def torch_run(overrides: Sequence[str]):
    """A torch run with the speed probe timed before and after it (``runners.profile_engine``):
    (record, summary, probe seconds). The probe writes only free KV blocks before the run and
    after it, so the run itself is untouched (its tree is compared with the sim's)."""
    server = build_server(compose_config(list(overrides), resolve=True))
    runner, prm = server.backend.runner, server.backend.prm
    before = speed_probe(runner, prm)
    rec = server.run()
    return rec, summarize_run(rec), (before + speed_probe(runner, prm)) / 2


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


def sim_run(cell: Sequence[str], common: Sequence[str], profile: str, rescale: bool = False):
    """The sim's prediction of a cell on the profile: as profiled (the torch runs' own probes
    give the speed-adjusted reading), or rescaled to this machine's probed speed."""
    speed = ["engine.rescale_to_probe=true"] if rescale else ["engine.probe_check=false"]
    overrides = ["engine=sim", *common, *scheduler_limits(torch_overrides(cell, common)), *cell, *speed]
    if Path(profile).suffix in (".yaml", ".yml") and Path(profile).is_file():
        return run(overrides, yaml.safe_load(Path(profile).read_text()))
    return run([*overrides, f"hardware={profile}"])


def compare(cell: Sequence[str], measured: Sequence[tuple], sim_rec, sim: dict,
            ref_probe: Optional[float] = None, rescaled: Optional[dict] = None) -> dict:
    """One row of fidelity.csv: the torch runs (tree, summary, probe seconds) against the
    sim's. With the profile's probe time, each run's timings are also read at the speed the
    machine had when profiled (divided by its probe ratio): ``*_rel_error_speed_adjusted``.
    With ``rescaled`` (the sim's summary with ``engine.rescale_to_probe=true``): the
    prediction priced at this machine's probed speed, ``*_rel_error_rescaled``."""
    sim_tree = tree(sim_rec)
    idle = [s["time_idle_s"] / s["makespan_s"] if s["makespan_s"] else 0.0 for _, s, *_ in measured]
    row: dict = {"cell": " ".join(cell), "trees_identical": all(t.equals(sim_tree) for t, *_ in measured),
                 "cost_model_extrapolated": sim.get("cost_model_extrapolated"), "torch_runs": len(measured),
                 "idle_share_measured": statistics.median(idle)}
    ratios = [p / ref_probe for *_, p in measured] if ref_probe else None
    row["probe_ratio"] = statistics.median(ratios) if ratios else float("nan")
    row["probe_ratio_spread"] = (max(ratios) - min(ratios)) / row["probe_ratio"] if ratios else float("nan")
    row["makespan_s_runs"] = runs_column([s["makespan_s"] for _, s, *_ in measured])
    for m in METRICS:
        vals = [s[m] for _, s, *_ in measured]
        med = statistics.median(vals)
        row[f"{m}_measured"] = med
        row[f"{m}_spread"] = (max(vals) - min(vals)) / med if med else 0.0
        row[f"{m}_predicted"] = sim[m]
        row[f"{m}_rel_error"] = sim[m] / med - 1.0 if med else float("nan")
    if rescaled is not None:
        row["rescale_device_ratio"] = rescaled.get("profile_device_probe_ratio")
        row["rescale_host_ratio"] = rescaled.get("profile_host_probe_ratio")
        for m in TIMED:  # every TIMED metric is one of METRICS: its measured median is in row
            med = row[f"{m}_measured"]
            row[f"{m}_predicted_rescaled"] = rescaled[m]
            row[f"{m}_rel_error_rescaled"] = rescaled[m] / med - 1.0 if med else float("nan")
    for m in PRESSURE_METRICS:
        row[f"{m}_measured"] = statistics.median(s.get(m, 0.0) for _, s, *_ in measured)
        row[f"{m}_predicted"] = sim.get(m, 0.0)
    triggers = sorted({k for k in sim if k.startswith(TRIGGER_PREFIX)}
                      | {k for _, s, *_ in measured for k in s if k.startswith(TRIGGER_PREFIX)})
    for key in triggers:
        med = statistics.median(s.get(key, 0.0) for _, s, *_ in measured)
        row[f"{key}_measured"], row[f"{key}_predicted"] = med, sim.get(key, 0.0)
        row[f"{key}_rel_error"] = sim.get(key, 0.0) / med - 1.0 if med else float("nan")
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


# A Poisson cell whose engine sat idle for less than this share of its makespan was busy
# (a high rate): its makespan is service time, not the arrival window, and counts as evidence.
BUSY_IDLE_SHARE = 0.10


def _errors(g: pd.DataFrame, col: str = "makespan_s_rel_error") -> str:
    err = g[col].abs()
    return f"median {100 * err.median():.1f}% (max {100 * err.max():.1f}%)"


def workload_kind(df: pd.DataFrame) -> pd.Series:
    """saturated / poisson per cell; the --pressure cells apart ("pressure"), so the goal's
    saturated reading is the widened grid's."""
    kind = df["cell"].str.extract(r"workload=(\S+)", expand=False)
    if "context" in df:
        kind = kind.where(~df["context"].astype(str).str.startswith("pressure:"), "pressure")
    return kind


def workload_lines(df: pd.DataFrame) -> list[str]:
    """Per arrival workload: a Poisson cell's makespan is mostly its arrival window (the
    same on both engines), so its error says little; saturated cells are read apart, and
    busy Poisson cells (idle under ``BUSY_IDLE_SHARE`` of the makespan) beside them."""
    out = []
    for wl, g in df.groupby(workload_kind(df)):
        dev = (g["time_generation_s_rel_error"].abs() + g["time_verification_s_rel_error"].abs()) / 2
        line = (f"  {wl}: {len(g)} cells, makespan error {_errors(g)}, device time error median "
                f"{100 * dev.median():.1f}%, torch runs' makespan spread median "
                f"{100 * g['makespan_s_spread'].median():.0f}%")
        if wl != "saturated" and "idle_share_measured" in g:
            busy = g[g["idle_share_measured"] < BUSY_IDLE_SHARE]
            line += (f"; {len(busy)} busy (idle < {100 * BUSY_IDLE_SHARE:.0f}% of the makespan)"
                     + (f": makespan error {_errors(busy)}" if len(busy) else ""))
        adj = g.get("makespan_s_rel_error_speed_adjusted")
        if adj is not None and adj.notna().any():
            line += (f"; at the profiled speed (probe ratio median {g['probe_ratio'].median():.2f}): makespan "
                     f"error {_errors(g, 'makespan_s_rel_error_speed_adjusted')}")
        res = g.get("makespan_s_rel_error_rescaled")
        if res is not None and res.notna().any():
            line += (f"; the profile rescaled to this machine's probe (device x{g['rescale_device_ratio'].median():.2f}): "
                     f"makespan error {_errors(g, 'makespan_s_rel_error_rescaled')}")
        out.append(line + ratio_part(g))
    return out


RATIO_GOAL = 0.03  # each policy's makespan ratio to nonspec: the fidelity goal's tolerance


def ratio_part(g: pd.DataFrame) -> str:
    """How many policies' makespan ratios to nonspec the sim predicts within ``RATIO_GOAL``."""
    r = policy_ratios(g)
    r = r[r["policy"] != "nonspec"] if len(r) else r  # (empty, without columns, where no nonspec ran)
    if not len(r):
        return ""
    err = r["rel_error"].abs()
    return (f"; policy ratios to nonspec within {100 * RATIO_GOAL:.0f}%: {int((err <= RATIO_GOAL).sum())}/{len(r)} "
            f"(median error {100 * err.median():.1f}%, max {100 * err.max():.1f}%"
            + ("; measured paired by repetition)" if r["paired"].all() else ")"))


def trigger_lines(df: pd.DataFrame) -> list[str]:
    """Per PRM batch trigger: the error of the verification seconds it accounts for, over the
    cells where it fired on the engine (are lazy verification's batches priced right?)."""
    out = []
    for col in sorted(c for c in df.columns if c.startswith(TRIGGER_PREFIX) and c.endswith("_measured")):
        key = col.removesuffix("_measured")
        g = df[df[col] > 0]
        if len(g):
            out.append(f"  PRM batches by trigger {key.removeprefix(TRIGGER_PREFIX)}: {len(g)} cells, verification "
                       f"seconds error {_errors(g, key + '_rel_error')}")
    return out


def pressure_lines(df: pd.DataFrame) -> list[str]:
    """The --pressure cells, one line each: does the sim price waiting as the engine pays it?"""
    out = []
    for _, r in df[df["context"].astype(str).str.startswith("pressure:")].iterrows():
        out.append(f"  {r['context']} ({r['policy']}): makespan error {100 * r['makespan_s_rel_error']:+.1f}%, "
                   f"preemptions {r['preemptions_measured']:.0f} measured / {r['preemptions_predicted']:.0f} "
                   f"predicted, row cap bound in {100 * r['row_cap_bound_share_measured']:.0f}% of iterations")
    return out


def last_line(df: pd.DataFrame) -> str:
    """The headline: saturated and Poisson cells apart (the goal is read on saturated cells)."""
    kinds = workload_kind(df)
    parts = [f"{wl} {len(g)}: median makespan error {100 * g['makespan_s_rel_error'].abs().median():.1f}%, "
             f"max {100 * g['makespan_s_rel_error'].abs().max():.1f}%" for wl, g in df.groupby(kinds)]
    return (f"fidelity: {len(df)} cells ({'; '.join(parts)}), trees identical "
            f"{int(df['trees_identical'].sum())}/{len(df)}")


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
    sec.notes.extend([*workload_lines(df), *trigger_lines(df), *pressure_lines(df), last_line(df)])
    return sec


def torch_grid(args) -> list[tuple[str, str, list[str]]]:
    """(context, policy, overrides) per cell: the default SHAPES, or the product of --beams,
    --concurrency and --n-problems when any of them is given."""
    if args.beams or args.concurrency or args.n_problems:
        shapes = [(int(b), 2, int(c), args.n_problems or 16) for b in (args.beams or "4,8,16").split(",")
                  for c in (args.concurrency or "4,16").split(",")]
    else:
        shapes = [tuple(int(v) for v in shape.split("/")) for shape in args.shapes.split(",")]
        if any(len(s) != 4 for s in shapes):
            raise SystemExit(f"--shapes: each shape is beam/expansion/concurrency/problems, got {args.shapes!r}")
    grid = [(f"{wl} b{b} m{m} c{c} n{n}", pol,
             [f"workload={wl}", f"beam={b}", f"expansion={m}", f"concurrency={c}", f"n_problems={n}", f"policy={pol}"])
            for wl in args.workloads.split(",") for b, m, c, n in shapes for pol in args.policies.split(",")]
    if getattr(args, "pressure", False):
        grid += [(f"pressure: {label}", pol, ["workload=saturated", "beam=8", f"expansion={m}", "concurrency=8",
                                               "n_problems=12", f"policy={pol}", *extra])
                 for label, m, pols, extra in PRESSURE for pol in pols]
    return grid


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
    ap.add_argument("--shapes", default=SHAPES, help="torch mode: beam/expansion/concurrency/problems per "
                    "shape, comma-separated (the default grid; --beams/--concurrency/--n-problems replace it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pressure", action="store_true", help="torch mode: add the PRESSURE cells (KV preemption, "
                    "a binding row cap, each lazy-verification trigger) and report the error per trigger kind")
    ap.add_argument("--rescale-to-probe", action="store_true", help="also predict every cell with the profile "
                    "rescaled to this machine's probed speed (engine.rescale_to_probe=true): both readings reported")
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
    if args.engine == "vllm":
        common = [*base, f"n_problems={args.n_problems}", f"seed={args.seed}", *args.set]
        grid = list(itertools.product(args.workloads.split(","), [int(b) for b in args.beams.split(",")],
                                      [int(c) for c in args.concurrency.split(",")], args.policies.split(",")))
        cells = [[f"workload={wl}", f"beam={beam}", f"concurrency={conc}", f"policy={pol}"]
                 for wl, beam, conc, pol in grid]
        return fidelity_vllm.main(args, common, cells, [(f"{wl} b{beam} c{conc}", pol) for wl, beam, conc, pol in grid])
    common = [*base, f"seed={args.seed}", *args.set]
    grid = torch_grid(args)
    cells = [cell for _, _, cell in grid]
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
    for i, ((context, pol, cell), runs) in enumerate(zip(grid, measured), 1):
        rescaled = sim_run(cell, common, args.profile, rescale=True)[1] if args.rescale_to_probe else None
        row = compare(cell, runs, *sim_run(cell, common, args.profile), ref_probe=ref_probe, rescaled=rescaled)
        row.update(context=context, policy=pol)
        rows.append(row)
        print(cell_line(i, len(grid), row, "tree " + ("same" if row["trees_identical"] else "DIFFERS")), flush=True)
    df = pd.DataFrame(rows)
    write_run(df, Path(args.results_dir) / SUBDIR, error_summary(df), scatter(df),
              [*workload_lines(df), *trigger_lines(df), *pressure_lines(df)])
    print(last_line(df))
    return 0 if df["trees_identical"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
