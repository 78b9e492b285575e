"""Profile the torch engine on the device at hand; write a cost profile the sim can use.

    python -m runners.profile_engine [--name cpu-tiny] [--reps 5] [--grid small|full]
        [--base-hardware a100] [--set KEY=VALUE ...] [--out-conf conf/hardware/profiled]
        [--out-table results/profiles]

Builds the engine of ``engine=torch`` (the model pair of ``model=``, tiny by default on
CPU; real-size random weights with ``--set model.load_format=random`` on a GPU) exactly as
a serving cell does, then times, each ``--reps`` times (median kept, quartiles beside it):

* generation iterations: decode rows x context length, and prefill chunks x cached prefix
  (make_batch + forward + LM head, timed as ``TorchBackend.forward`` times them: CUDA
  events from the call's start to the device's end, on an idle stream);
* PRM batches: tasks x new tokens x cached prefix over the paged PRM cache
  (``score_rows``, what ``TorchBackend.score`` times);
* host time: two short serving cells (nonspec and spec), whose "other" time is split
  into per-iteration and per-PRM-task seconds by non-negative least squares.

Fits ``specscale.engine.sim.profiled`` linear models to the medians and writes
``<out-conf>/<name>.yaml`` (a hardware config: memory and roofline figures of
``--base-hardware`` for capacity, plus the ``profile``; use it as
``hardware=profiled/<name>``) and ``<out-table>/<name>.parquet`` (every measurement), both
recording device, versions, threads, dtype and grid. No point of the grid is a cell of
``analysis.fidelity``'s default grid: the profile is built from micro-measurements only.
"""
from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
import yaml
from scipy.optimize import nnls

from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.engine.backend import resolve_seconds
from specscale.engine.sim.profiled import GEN_FEATURES, PRM_FEATURES, CostProfile, LinearCost, gen_features, prm_features
from specscale.engine.torch.attention_batch import BatchRow
from specscale.engine.torch.prm import PRMRow

REPO = Path(__file__).resolve().parents[1]
GRIDS = {
    "small": {"decode_rows": (1, 4, 16), "decode_ctx": (64, 256), "prefill": (32, 128), "prefill_cached": (0, 128),
              "prm_tasks": (1, 4, 16), "prm_new": (16, 64), "prm_cached": (0, 128)},
    "full": {"decode_rows": (1, 8, 32, 64, 128, 256), "decode_ctx": (128, 512, 1024, 2048),
             "prefill": (64, 256, 1024, 4096), "prefill_cached": (0, 512, 2048),
             "prm_tasks": (1, 4, 16, 64, 128), "prm_new": (16, 64, 256), "prm_cached": (0, 512, 2048)},
}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def timings(fn: Callable[[], float], reps: int) -> dict[str, float]:
    fn()  # warm-up: allocator, first-call kernels
    ts = [fn() for _ in range(reps)]
    q = np.percentile(ts, [25, 75])
    return {"median_s": statistics.median(ts), "p25_s": float(q[0]), "p75_s": float(q[1]), "reps": reps}


def gen_table(runner, grid: dict, reps: int) -> pd.DataFrame:
    bs, cap, vocab = runner.block_size, runner.num_blocks, runner.config.vocab_size
    rows_out = []

    def run(rows: list[BatchRow], want: list[int]) -> float:
        def work():
            b = runner.make_batch(rows)
            h = runner.forward(b)
            return runner.compute_logits(h, b, want)
        return resolve_seconds(runner.timed(work)[1])  # waits for the device: the next run starts idle

    for n, ctx in itertools.product(grid["decode_rows"], grid["decode_ctx"]):
        per = -(-(ctx + 1) // bs)
        if n * per > cap or ctx + 1 > runner.max_model_len:
            continue  # does not fit this engine's pool / window: not measured
        rows = [BatchRow([i % vocab], ctx, list(range(i * per, (i + 1) * per))) for i in range(n)]
        rows_out.append({"kind": "decode", **dict(zip(GEN_FEATURES, gen_features([ctx + 1] * n, [], n))),
                         **timings(lambda: run(rows, list(range(n))), reps)})
    for n, cached in itertools.product(grid["prefill"], grid["prefill_cached"]):
        blocks = -(-(cached + n) // bs)
        if blocks > cap or cached + n > runner.max_model_len:
            continue
        rows = [BatchRow([(7 * i) % vocab for i in range(n)], cached, list(range(blocks)))]
        rows_out.append({"kind": "prefill", **dict(zip(GEN_FEATURES, gen_features([], [(n, cached)], 1))),
                         **timings(lambda: run(rows, [0]), reps)})
    return pd.DataFrame(rows_out)


def prm_table(prm, grid: dict, reps: int) -> pd.DataFrame:
    if prm.kv_cache is None:
        raise SystemExit("profile_engine: the PRM has no KV pool; profile with engine.prm_prefix_cache=true")
    bs, cap, vocab = prm.block_size, prm.kv_cache.num_blocks, prm.config.vocab_size
    out = []
    for tasks, new, cached in itertools.product(grid["prm_tasks"], grid["prm_new"], grid["prm_cached"]):
        per = -(-(cached + new) // bs)
        if tasks * per > cap or cached + new > prm.max_model_len:
            continue
        rows = [PRMRow([(3 * i + t) % vocab for i in range(new)], cached, list(range(t * per, (t + 1) * per)),
                       [new - 1]) for t in range(tasks)]
        out.append({"kind": "prm", **dict(zip(PRM_FEATURES, prm_features([(new, cached)] * tasks))),
                    **timings(lambda: prm_runner_time(prm, rows), reps)})
    return pd.DataFrame(out)


def prm_runner_time(prm, rows) -> float:
    t0 = time.perf_counter()
    prm.score_rows(rows)  # returns host lists: the device work is finished when it returns
    return time.perf_counter() - t0


def host_costs(base: Sequence[str]) -> tuple[float, float, list[dict]]:
    """Per-iteration and per-PRM-task host seconds from two short serving cells."""
    from specscale.metrics.summary import summarize

    X, y, cells = [], [], []
    for policy in ("nonspec", "spec"):
        cfg = compose_config([*base, f"policy={policy}", "n_problems=2", "beam=4", "progress=false",
                              "wandb.mode=disabled"], resolve=True)
        server = build_server(cfg)
        rec = server.run()
        s = summarize(rec, [60], 1)
        iters = sum(1 for it in rec.iterations if it["kind"] == "generate")
        tasks = sum(b["n_tasks"] for b in rec.verify_batches)
        X.append([iters, tasks])
        y.append(s["time_other_s"])
        cells.append({"kind": "host", "policy": policy, "iterations": iters, "prm_tasks": tasks,
                      "median_s": s["time_other_s"], "reps": 1})
    coef, _ = nnls(np.asarray(X, dtype=float), np.asarray(y, dtype=float))
    return float(coef[0]), float(coef[1]), cells


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default=None, help="profile name (default: <device>-<model>)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--grid", default="small", choices=sorted(GRIDS))
    ap.add_argument("--base-hardware", default="a100", help="conf/hardware whose memory/roofline figures the "
                    "profile keeps for KV capacity (timings come from the measurements)")
    ap.add_argument("--set", action="append", default=[], help="config override (repeatable), e.g. model=tiny")
    ap.add_argument("--out-conf", default=str(REPO / "conf" / "hardware" / "profiled"))
    ap.add_argument("--out-table", default=str(REPO / "results" / "profiles"))
    args = ap.parse_args(argv)
    if not any(o.startswith("model=") for o in args.set):  # tiny on CPU; real-size random weights on a GPU
        args.set = (["model=tiny"] if not torch.cuda.is_available() else
                    ["model=qwen2.5-7b", "model.load_format=random", "dataset=fixture_math500"]) + args.set
    base = ["engine=torch", "engine.prm_prefix_cache=true", *args.set]
    cfg = compose_config([*base, "n_problems=1", "progress=false", "wandb.mode=disabled"], resolve=True)
    t0 = time.perf_counter()
    server = build_server(cfg)
    backend = server.backend
    runner, prm = backend.runner, backend.prm
    dev = device_name(runner.device)
    name = args.name or f"{'cpu' if runner.device.type == 'cpu' else 'gpu'}-{cfg['model']['name']}"
    print(f"profiling {cfg['model']['name']} on {dev}, grid {args.grid}, {args.reps} reps", flush=True)
    grid = GRIDS[args.grid]
    with torch.inference_mode():
        gen = gen_table(runner, grid, args.reps)
        print(f"  generation: {len(gen)} points ({time.perf_counter() - t0:.0f} s)", flush=True)
        prm_t = prm_table(prm, grid, args.reps)
        print(f"  PRM: {len(prm_t)} points ({time.perf_counter() - t0:.0f} s)", flush=True)
    host_it, host_task, host_rows = host_costs(base)
    print(f"  host: {host_it * 1e3:.3f} ms per iteration, {host_task * 1e3:.3f} ms per PRM task", flush=True)
    meta = {"model": cfg["model"]["name"], "dtype": str(runner.dtype).removeprefix("torch."), "grid": args.grid,
            "reps": args.reps, "torch": str(torch.__version__), "python": platform.python_version(),
            "threads": torch.get_num_threads(), "host": platform.node(), "overrides": list(args.set),
            "profiled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    profile = CostProfile(dev, LinearCost.fit(GEN_FEATURES, gen[list(GEN_FEATURES)].to_numpy(), gen["median_s"]),
                          LinearCost.fit(PRM_FEATURES, prm_t[list(PRM_FEATURES)].to_numpy(), prm_t["median_s"]),
                          host_it, host_task, meta)
    hw = compose_config([f"hardware={args.base_hardware}"], resolve=True)["hardware"]
    out_conf = Path(args.out_conf)
    out_conf.mkdir(parents=True, exist_ok=True)
    conf = {"name": f"profiled:{name}", "memory_gb": hw["memory_gb"], "hbm_bandwidth_tb_s": hw["hbm_bandwidth_tb_s"],
            "bf16_tflops": hw["bf16_tflops"], "profile": profile.as_dict()}
    header = (f"# Cost profile measured by `python -m runners.profile_engine` on {dev}.\n"
              f"# memory_gb / hbm_bandwidth_tb_s / bf16_tflops are {hw['name']}'s (KV capacity only);\n"
              "# every timing comes from the measured table (see profile.meta).\n")
    (out_conf / f"{name}.yaml").write_text(header + yaml.safe_dump(conf, sort_keys=False))
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
