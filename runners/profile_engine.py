"""Profile the torch engine on the device at hand; write a cost profile the sim can use.

    python -m runners.profile_engine [--name cpu-tiny] [--reps 5] [--grid full|small]
        [--base-hardware a100] [--set KEY=VALUE ...] [--out-conf conf/hardware/profiled]
        [--out-table results/profiles]

Builds the engine of ``engine=torch`` (the model pair of ``model=``, tiny by default on
CPU; real-size random weights with ``--set model.load_format=random`` on a GPU) exactly as
a serving cell does, then times, in ``--reps`` interleaved rounds (every point once per
round, so no batch runs back to back with itself; median kept, quartiles beside it):

* generation iterations: decode rows x context length, and prefill chunks x cached prefix
  (make_batch + forward + LM head, timed as ``TorchBackend.forward`` times them: CUDA
  events from the call's start to the device's end, on an idle stream), and decode rows
  with a prefill chunk in one iteration;
* PRM batches: tasks x new tokens x cached prefix over the paged PRM cache
  (``score_rows``, what ``TorchBackend.score`` times);
* short serving cells (``HOST_CELLS``: synthetic tokens, saturated, none of them a
  fidelity cell), run on the engine and on the sim with the micro-benchmark profile:
  their wall-clock gaps between device calls fit the host model, per generation
  iteration and per PRM batch, to what each did (rows, draws, step ends, forks; tasks,
  tokens) by non-negative least squares (``specscale.engine.host_gaps``); and their
  device seconds over the profile's for the same iterations give the in-loop factors
  (``serving_fit``).

Fits ``specscale.engine.sim.profiled`` linear models to the medians (relative error) and writes
``<out-conf>/<name>.yaml`` (a hardware config: memory and roofline figures of
``--base-hardware`` for capacity, plus the ``profile``; use it as
``hardware=profiled/<name>``) and ``<out-table>/<name>.parquet`` (every measurement), both
recording device, versions, threads, dtype and grid. No point of the grid is a cell of
``analysis.fidelity``'s default grid: the profile is built from micro-measurements only.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch
import yaml

from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.settings import CellSpec
from specscale.settings.search_policy import ConfigError
from specscale.engine.cost_profile import GEN_FEATURES, PRM_FEATURES, CostProfile, LinearCost
from specscale.engine.host_gaps import fit_host_model, host_gaps, predict_host
from specscale.engine.host_probe import host_probe
from specscale.clock import HostCostModel
from specscale.engine.torch.profiler import (SHORT_SEARCH, device_name, gen_points, measure,
                                              prm_points, scheduler_limits, speed_probe)

REPO = Path(__file__).resolve().parents[1]
# Points that do not fit the engine's pool or context window are skipped (and not measured).
# Ragged points (one long row or task among short ones of RAGGED_SHORT tokens) tell a padded
# attention's cost (rows x longest) from a ragged one's (sum of lengths).
# "full" spans the small iterations a short search runs by the thousand (1 row, 32 tokens)
# up to serving scale (256 rows x 2k context); "small" is a smoke grid for tests.
GRIDS = {
    "small": {"decode_rows": (1, 4, 16), "decode_ctx": (64, 256), "prefill": (32, 128), "prefill_cached": (0, 128),
              "mixed_rows": (4,), "mixed_prefill": (32,), "ragged_rows": (8,), "ragged_long": (256,),
              "prm_tasks": (1, 4, 16), "prm_new": (16, 64), "prm_cached": (0, 128),
              "ragged_tasks": (8,), "ragged_new": (16,), "ragged_cached": (256,),
              "host_cells": (("nonspec", 2, 4), ("spec", 6, 4), ("full", 6, 4)), "host_problems": 3},
    "full": {"decode_rows": (1, 2, 4, 8, 16, 32, 64, 128, 256), "decode_ctx": (32, 128, 512, 1024, 2048),
             "prefill": (8, 32, 128, 512, 2048), "prefill_cached": (0, 128, 512, 2048),
             "mixed_rows": (4, 32), "mixed_prefill": (32, 128), "ragged_rows": (16, 64, 256),
             "ragged_long": (256, 768),
             "prm_tasks": (1, 2, 4, 8, 16, 32, 64, 128), "prm_new": (8, 32, 128, 512),
             "prm_cached": (0, 128, 512, 2048),
             "ragged_tasks": (8, 32, 64), "ragged_new": (16, 32), "ragged_cached": (256, 768),
             "host_cells": None, "host_problems": 8},  # None: HOST_CELLS
}
# Host-cost cells: (policy, beam, concurrency), saturated arrivals, seed 7. None is a cell of
# analysis.fidelity's default grid (beams 4/8/16, concurrency 4/16, seed 0): the host model
# is fitted on one set of runs and checked on others.
HOST_CELLS = (("nonspec", 6, 8), ("spec", 6, 8), ("full", 6, 8), ("ep_cd", 12, 8), ("fasttts", 2, 8),
              ("full", 12, 3), ("ep", 12, 8))


def grid_cells(grid: str) -> Sequence[tuple[str, int, int]]:
    return GRIDS[grid]["host_cells"] or HOST_CELLS


def serving_cell(model_set: Sequence[str], policy: str, beam: int, conc: int, n_problems: int) -> list[str]:
    """The overrides of one short serving cell of the host fit (either engine)."""
    return [*model_set, *SHORT_SEARCH, f"policy={policy}", f"beam={beam}", f"concurrency={conc}",
            "workload=saturated", "seed=7", f"n_problems={n_problems}", "engine.kv_blocks=4096",
            "engine.prm_kv_blocks=1024", "progress=false", "wandb.mode=disabled"]


# On the CPU the profiling engine's pools are fixed sizes (no memory probing): large enough
# that the grid's serving-scale points (256 rows x 1k context, 128 PRM tasks x 1k tokens) fit
# and are measured rather than extrapolated. Pool size does not change a forward's cost.
CPU_POOLS = ("engine.cpu_kv_blocks=17408", "engine.cpu_prm_kv_blocks=8448")


def serving_fit(model_set: Sequence[str], hardware: dict, cells: Sequence[tuple[str, int, int]] = HOST_CELLS,
                n_problems: int = 8, probe_s: Optional[float] = None) -> tuple[HostCostModel, dict[str, float], list[dict]]:
    """What the micro-benchmarks cannot see, fitted on short serving cells (``HOST_CELLS``:
    synthetic tokens, saturated arrivals, none a fidelity cell), each run on the torch engine
    and on the sim with the provisional profile in ``hardware`` (same tree, same schedule):

    * the host model: the wall-clock gaps between device calls, per generation iteration
      and per PRM batch, by non-negative least squares on what each did (``host_gaps``);
    * the in-loop factors: measured device seconds of the cells' generation iterations (PRM
      batches) over what the profile predicts for the very same iterations. On the CPU the
      serving loop's Python work shares the caches the forward needs, so a forward inside
      the loop costs more than the same batch timed in isolation.

    With ``probe_s`` (the speed probe's time during the micro-benchmarks), each cell's
    timings are read at that speed (divided by its own probe time over ``probe_s``), so a
    slow or fast stretch of a shared machine is not fitted into the host model or the
    factors."""
    from specscale.metrics.summary import summarize

    # engine.* overrides are the torch engine's (the sim takes its scheduling limits only).
    engine_set = [o for o in model_set if o.lstrip("+").startswith("engine.")]
    model_set = [o for o in model_set if o not in engine_set]
    gaps, cells_out = [], []
    device = {"generation": [0.0, 0.0], "prm": [0.0, 0.0]}  # kind -> [measured, predicted]
    for policy, beam, conc in cells:
        common = serving_cell(model_set, policy, beam, conc, n_problems)
        torch_set = ["engine=torch", "engine.synthetic_tokens=true", "engine.prm_prefix_cache=true", *common,
                     *engine_set]
        server = build_server(compose_config(torch_set, resolve=True))
        before = speed_probe(server.backend.runner, server.backend.prm)
        rec = server.run()
        speed = ((before + speed_probe(server.backend.runner, server.backend.prm)) / 2 / probe_s) if probe_s else 1.0
        # No speed check: the profile being fitted was measured here, minutes ago.
        sim_cfg = compose_config(["engine=sim", *common, *scheduler_limits(torch_set), "engine.probe_check=false"],
                                 resolve=True)
        sim_cfg["hardware"] = hardware
        sim = summarize(build_server(sim_cfg).run(), [60], 1)
        s = summarize(rec, [60], 1)
        for kind, key in (("generation", "time_generation_s"), ("prm", "time_verification_s")):
            device[kind][0] += s[key] / speed
            device[kind][1] += sim[key]
        g = host_gaps(rec.iterations, rec.makespan_s)
        g["gap_s"] /= speed
        gaps.append(g)
        cells_out.append({"kind": "host", "policy": policy, "beam": beam, "concurrency": conc,
                          "iterations": int((g["kind"] == "generate").sum()),
                          "prm_batches": int((g["kind"] == "verify").sum()),
                          "median_s": s["time_other_s"] / speed, "measured_s": s["time_other_s"],  # median_s: at
                          # the profiled speed (what is fitted); measured_s: as measured
                          "generation_measured_s": s["time_generation_s"], "generation_profile_s":
                          sim["time_generation_s"], "prm_measured_s": s["time_verification_s"],
                          "prm_profile_s": sim["time_verification_s"], "probe_ratio": speed, "reps": 1})
    model = fit_host_model(pd.concat(gaps, ignore_index=True))
    for c, g in zip(cells_out, gaps):
        c["predicted_s"] = float(predict_host(model, g).sum())
    in_loop = {kind: (m / p if p > 0 else 1.0) for kind, (m, p) in device.items()}
    return model, in_loop, cells_out


def hardware_conf(name: str, base_hardware: str) -> dict:
    """A profiled hardware config without its profile: ``base_hardware``'s memory and
    roofline figures (KV capacity only; every timing comes from the profile)."""
    hw = compose_config([f"hardware={base_hardware}"], resolve=True)["hardware"]
    return {"name": f"profiled:{name}", "memory_gb": hw["memory_gb"], "hbm_bandwidth_tb_s": hw["hbm_bandwidth_tb_s"],
            "bf16_tflops": hw["bf16_tflops"]}


def write_conf(path: Path, conf: dict, command: str, dev: str, base_hardware: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    hw = compose_config([f"hardware={base_hardware}"], resolve=True)["hardware"]
    header = (f"# Cost profile measured by `python -m {command}` on {dev}.\n"
              f"# memory_gb / hbm_bandwidth_tb_s / bf16_tflops are {hw['name']}'s (KV capacity only);\n"
              "# every timing comes from the measured table (see profile.meta).\n")
    path.write_text(header + yaml.safe_dump(conf, sort_keys=False))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default=None, help="profile name (default: <device>-<model>)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--grid", default="full", choices=sorted(GRIDS), help="full: ~2 min for the tiny pair on "
                    "2 CPU cores; small: a smoke test")
    ap.add_argument("--base-hardware", default="a100", help="conf/hardware whose memory/roofline figures the "
                    "profile keeps for KV capacity (timings come from the measurements)")
    ap.add_argument("--set", action="append", default=[], help="config override (repeatable), e.g. model=tiny")
    ap.add_argument("--out-conf", default=str(REPO / "conf" / "hardware" / "profiled"))
    ap.add_argument("--out-table", default=str(REPO / "results" / "profiles"))
    args = ap.parse_args(argv)
    if not any(o.startswith("model=") for o in args.set):  # tiny on CPU; real-size random weights on a GPU
        args.set = (["model=tiny"] if not torch.cuda.is_available() else
                    ["model=qwen2.5-7b", "model.load_format=random", "dataset=fixture_math500"]) + args.set
    pools = [] if torch.cuda.is_available() else list(CPU_POOLS)
    # The host fit runs every HOST_CELLS cell on the sim too: a setting the sim refuses
    # (model=testbed without synthetic=testbed) fails here, not after the micro-benchmarks.
    sim_set = [o for o in args.set if not o.lstrip("+").startswith("engine.")]
    try:
        for policy, beam, conc in grid_cells(args.grid):
            CellSpec.from_config(compose_config(["engine=sim", *serving_cell(sim_set, policy, beam, conc, 1)], resolve=True))
    except ConfigError as exc:
        raise SystemExit(f"error: the host fit's sim cells: {exc} (pass it with --set)") from None
    base = ["engine=torch", "engine.prm_prefix_cache=true", *pools, *args.set]
    cfg = compose_config([*base, "n_problems=1", "progress=false", "wandb.mode=disabled"], resolve=True)
    t0 = time.perf_counter()
    server = build_server(cfg)
    backend = server.backend
    runner, prm = backend.runner, backend.prm
    dev = device_name(runner.device)
    name = args.name or f"{'cpu' if runner.device.type == 'cpu' else 'gpu'}-{cfg['model']['name']}"
    print(f"profiling {cfg['model']['name']} on {dev}, grid {args.grid}, {args.reps} reps", flush=True)
    grid = GRIDS[args.grid]
    # The speed reference is the probe's median over readings between the grid's rounds: the
    # machine's speed while the table was measured. Two readings at its ends were two instants
    # of a drifting machine, and every later speed ratio (the serving cells' below, the
    # fidelity runs', engine.rescale_to_probe) divides by it.
    probes, host_before = [], host_probe()
    with torch.inference_mode():
        table = measure([*gen_points(runner, grid), *prm_points(prm, grid)], args.reps,
                        between=lambda: probes.append(speed_probe(runner, prm)))
    probe_s = statistics.median(probes)
    host_probe_s = (host_before + host_probe()) / 2
    gen, prm_t = table[table["kind"] != "prm"].reset_index(drop=True), table[table["kind"] == "prm"].reset_index(drop=True)
    print(f"  {len(gen)} generation and {len(prm_t)} PRM points, {args.reps} interleaved rounds "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    meta = {"model": cfg["model"]["name"], "dtype": str(runner.dtype).removeprefix("torch."), "grid": args.grid,
            "reps": args.reps, "torch": str(torch.__version__), "python": platform.python_version(),
            "threads": torch.get_num_threads(), "host": platform.node(), "overrides": list(args.set),
            "probe_s": probe_s, "probe_readings_s": [round(x, 7) for x in probes], "host_probe_s": host_probe_s,
            "profiled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    profile = CostProfile(dev, LinearCost.fit(GEN_FEATURES, gen[list(GEN_FEATURES)].to_numpy(), gen["median_s"]),
                          LinearCost.fit(PRM_FEATURES, prm_t[list(PRM_FEATURES)].to_numpy(), prm_t["median_s"]),
                          HostCostModel(), meta)
    conf = hardware_conf(name, args.base_hardware)
    host, in_loop, host_rows = serving_fit(args.set, {**conf, "profile": profile.as_dict()},
                                           grid_cells(args.grid), grid["host_problems"], probe_s=probe_s)
    profile = dataclasses.replace(profile, host=host, in_loop=in_loop)
    conf["profile"] = profile.as_dict()
    print(f"  in the serving loop: generation x{in_loop['generation']:.3f}, PRM x{in_loop['prm']:.3f} the "
          "micro-benchmarks' time for the same batches", flush=True)
    print(f"  host: {host.iteration_s * 1e3:.3f} ms per iteration + {host.draw_s * 1e6:.1f} us per draw + "
          f"{host.step_end_s * 1e6:.1f} us per step end; {host.prm_batch_s * 1e3:.3f} ms per PRM batch + "
          f"{host.prm_task_s * 1e6:.1f} us per task", flush=True)
    for c in host_rows:
        print(f"    {c['policy']} beam {c['beam']}: other {c['median_s']:.3f} s measured (at the profiled speed; "
              f"probe ratio {c['probe_ratio']:.2f}), {c['predicted_s']:.3f} s fitted", flush=True)
    out_conf = Path(args.out_conf)
    write_conf(out_conf / f"{name}.yaml", conf, "runners.profile_engine", dev, args.base_hardware)
    table = pd.concat([gen, prm_t, pd.DataFrame(host_rows)], ignore_index=True)
    for k, v in meta.items():
        table[f"meta_{k}"] = str(v)
    table["device"] = dev
    out_table = Path(args.out_table)
    out_table.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out_table / f"{name}.parquet", index=False)
    for kind, lin, df in (("generation", profile.generation, gen), ("PRM", profile.prm, prm_t)):
        names = lin.names
        pred = df[list(names)].to_numpy() @ np.asarray(lin.coef)
        err = np.abs(pred / df["median_s"].to_numpy() - 1)
        print(f"  {kind} fit: median |error| {100 * np.median(err):.1f}%, max {100 * err.max():.1f}% over "
              f"{len(df)} points")
    print(f"wrote {out_conf / (name + '.yaml')} and {out_table / (name + '.parquet')} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
