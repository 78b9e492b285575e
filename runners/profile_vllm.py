"""Profile engine=vllm from its own step timings; write a cost profile.

    python -m runners.profile_vllm [--name cpu-vllm-tiny] [--n-problems 6] [--set KEY=VALUE ...]
        [--base-hardware a100] [--out-conf conf/hardware/profiled] [--out-table results/profiles]

vLLM cannot be timed batch by batch from outside (its scheduler forms the batches), so it
is profiled in the serving loop: short saturated vLLM cells (``PROFILE_CELLS``, seed 7,
none of them a cell of ``analysis.fidelity --engine vllm``'s grid) run as any cell does;
every generation iteration (``llm.step()``, timed by ``VLLMGeneration.step``) and PRM batch
is recorded with what vLLM scheduled (``specscale.engine.vllm.features``), and
``specscale.engine.vllm.replay.fit_profile`` fits the profiled cost model's linear
generation and PRM costs to them (relative-error NNLS, as ``LinearCost.fit``) and the host
model to the gaps between calls (``specscale.engine.host_gaps``). ``in_loop`` is 1: the
timings come from the loop itself.

Writes ``<out-conf>/<name>.yaml`` (``hardware=profiled/<name>``; device "vLLM <version>
on ...") and ``<out-table>/<name>.parquet`` (every call: cell, kind, seconds, gap,
features), with meta: engine, versions, threads, cells. The profile prices vLLM's own
schedule; the sim cannot rebuild vLLM's tree, so ``analysis.fidelity --engine vllm``
checks it by replaying vLLM runs' schedules (trees: n/a).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from analysis.fidelity_vllm import VLLM_SET, run_replayed, vllm_device
from runners.profile_engine import REPO, hardware_conf, write_conf
from specscale.engine.vllm.replay import fit_profile

# (policy, beam, concurrency), saturated, seed 7: beams 2/6/12 and concurrency 3/6 are not
# in the fidelity grid (beams 4/8, concurrency 4, seed 0), so the profile is checked on
# runs it was not fitted to.
PROFILE_CELLS = (("nonspec", 6, 3), ("spec", 6, 3), ("full", 6, 3), ("ep_cd", 6, 3), ("nonspec", 2, 6),
                 ("spec", 12, 3), ("full", 12, 3), ("ep_cd", 2, 6))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="cpu-vllm-tiny")
    ap.add_argument("--n-problems", type=int, default=6)
    ap.add_argument("--cells", default=None, help="policy:beam:concurrency,... (default: PROFILE_CELLS)")
    ap.add_argument("--base-hardware", default="a100", help="conf/hardware whose memory figures the profile keeps")
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--out-conf", default=str(REPO / "conf" / "hardware" / "profiled"))
    ap.add_argument("--out-table", default=str(REPO / "results" / "profiles"))
    args = ap.parse_args(argv)
    cells = PROFILE_CELLS if args.cells is None else [
        (p, int(b), int(c)) for p, b, c in (x.split(":") for x in args.cells.split(","))]
    t0 = time.perf_counter()
    tables = []
    for policy, beam, conc in cells:
        _, s, table = run_replayed([*VLLM_SET, f"policy={policy}", f"beam={beam}", f"concurrency={conc}",
                                    "workload=saturated", "seed=7", f"n_problems={args.n_problems}", *args.set])
        tables.append(table.assign(cell=f"{policy} b{beam} c{conc}"))
        print(f"  {policy} beam {beam} concurrency {conc}: {int((table['kind'] == 'generate').sum())} iterations, "
              f"{int((table['kind'] == 'verify').sum())} PRM batches, makespan {s['makespan_s']:.2f} s", flush=True)
    import torch
    import vllm

    dev = vllm_device()
    meta = {"engine": "vllm", "model": "tiny_vllm", "vllm": vllm.__version__, "torch": str(torch.__version__),
            "python": platform.python_version(), "threads": torch.get_num_threads(), "host": platform.node(),
            "cells": [f"{p}:{b}:{c}" for p, b, c in cells], "n_problems": args.n_problems, "seed": 7,
            "overrides": [*VLLM_SET, *args.set], "profiled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    profile = fit_profile(tables, dev, meta)
    conf = {**hardware_conf(args.name, args.base_hardware), "profile": profile.as_dict()}
    write_conf(Path(args.out_conf) / f"{args.name}.yaml", conf, "runners.profile_vllm", dev, args.base_hardware)
    table = pd.concat(tables, ignore_index=True).assign(device=dev)
    out_table = Path(args.out_table)
    out_table.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out_table / f"{args.name}.parquet", index=False)
    for kind, lin, cols in (("generation", profile.generation, "x_gen_"), ("PRM", profile.prm, "x_prm_")):
        rows = table[table["kind"] == ("generate" if kind == "generation" else "verify")]
        pred = rows[[cols + n for n in lin.names]].to_numpy() @ lin.coef
        err = abs(pred / rows["seconds"].to_numpy() - 1)
        print(f"  {kind} fit over {len(rows)} calls: median |error| {100 * float(np.median(err)):.1f}%, summed "
              f"seconds {100 * (pred.sum() / rows['seconds'].sum() - 1):+.1f}%", flush=True)
    print(f"wrote {Path(args.out_conf) / (args.name + '.yaml')} and {out_table / (args.name + '.parquet')} "
          f"({time.perf_counter() - t0:.0f} s, {dev})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
