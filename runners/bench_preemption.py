"""Preemption under a small generator KV pool, with and without prefix caching (engine=torch).

    python -m runners.bench_preemption [--policies nonspec,spec,ep_cd,full] [--kv-blocks 320]
        [--prefix-caching on|off|both] [--beam 12] [--expansion 3] [--concurrency 5]
        [--n-problems 3] [--model tiny] [--seed 0] [--set KEY=VALUE ...] [--json OUT]

The preemption reproducer: the tiny pair on the CPU (``model=tiny``), beam 12,
expansion 3, concurrency 5, Poisson arrivals, 3 problems. Each policy runs twice per
prefix-caching setting: with the generator's pool cut to ``--kv-blocks`` blocks
(``engine.kv_blocks``), which forces preemptions, and unconstrained (the engine's own
pool). Printed per row: preemptions, prefill tokens recomputed because a preemption lost
their KV, prefill tokens re-attached from the prefix cache instead of computed, the
makespan and its ratio constrained / unconstrained (the goal: <= 1.5), and whether
the search tree equals the unconstrained one (strict policies must; the tiny pair runs
in float32 by default, so a rare last-bit flip can still change a token).

Prefix caching off reproduces the old recompute-everything preemption: on the default
settings it is slow (minutes per policy), hence ``--prefix-caching on`` by default.
The models are loaded once and reused by every cell (each cell gets a fresh KV
accounting, so no cached block survives from one cell to the next).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specscale.cell import build_server
from specscale.settings import CellSpec
from specscale.compose import compose_config
from specscale.engine.torch import build as torch_build

TREE_COLS = ["request_id", "round", "member_keys", "member_texts", "selected_keys"]


def tree(rec) -> list:
    """The search tree of a run in a canonical order (what must not change)."""
    rows = sorted(rec.rounds, key=lambda r: (r["request_id"], r["round"]))
    return [tuple(repr(r[c]) for c in TREE_COLS) for r in rows]


def run_one(cfg: dict, models) -> dict:
    spec = CellSpec.from_config(cfg)
    server = build_server(spec, built=torch_build.build_torch(spec, models=models))
    t0 = time.perf_counter()
    rec = server.run()
    gen = server.gen
    if rec.leaked_blocks or rec.leaked_sequences:
        raise RuntimeError(f"KV leak: {rec.leaked_blocks} blocks / {rec.leaked_sequences} sequences")
    return {
        "preemptions": gen.total_preemptions,
        "recomputed_prefill_tokens": gen.recomputed_prefill_tokens,
        "prefix_hit_tokens": gen.prefix_hit_tokens,
        "prefill_tokens": sum(r.get("prefill_tokens", 0) for r in rec.iterations),
        "logical_tokens": sum(r["logical_tokens"] for r in rec.requests),
        "kv_blocks": server.blocks.num_blocks,
        "kv_peak_blocks": rec.kv_peak_blocks,
        "makespan_s": rec.makespan_s,
        "wall_s": time.perf_counter() - t0,
        "_tree": tree(rec),
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="nonspec,spec,ep_cd,full")
    ap.add_argument("--kv-blocks", type=int, default=320, help="the constrained generator pool (engine.kv_blocks)")
    ap.add_argument("--prefix-caching", default="on", choices=["on", "off", "both"])
    ap.add_argument("--model", default="tiny", help="conf/model pair")
    ap.add_argument("--beam", type=int, default=12)
    ap.add_argument("--expansion", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=5)
    ap.add_argument("--n-problems", type=int, default=3)
    ap.add_argument("--workload", default="poisson")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows here (after every row)")
    args = ap.parse_args(argv)

    base = [
        "engine=torch", f"model={args.model}", f"beam={args.beam}", f"expansion={args.expansion}",
        f"concurrency={args.concurrency}", f"workload={args.workload}", f"n_problems={args.n_problems}",
        f"seed={args.seed}", "progress=false", "wandb.mode=disabled", *args.set,
    ]
    switches = {"on": ["true"], "off": ["false"], "both": ["true", "false"]}[args.prefix_caching]
    policies = args.policies.split(",")
    t0 = time.perf_counter()
    # Built with the unconstrained pool: a constrained cell's block manager uses the first
    # kv_blocks blocks of the same paged cache.
    models = torch_build.build_models(compose_config([*base, f"policy={policies[0]}"], resolve=True))
    print(f"preemption: {args.model} on {models[0].device} ({models[0].dtype}), beam {args.beam} x "
          f"expansion {args.expansion}, concurrency {args.concurrency}, {args.workload}, {args.n_problems} "
          f"problems; constrained pool {args.kv_blocks} blocks; models built in {time.perf_counter() - t0:.1f} s")
    rows: list[dict] = []
    header = True
    for policy in policies:
        for pc in switches:
            common = [*base, f"policy={policy}", f"engine.prefix_caching={pc}"]
            free = run_one(compose_config(common, resolve=True), models)
            small = run_one(compose_config([*common, f"engine.kv_blocks={args.kv_blocks}"], resolve=True), models)
            for label, r in (("unconstrained", free), ("constrained", small)):
                row = {"policy": policy, "prefix_caching": pc == "true", "pool": label,
                       **{k: v for k, v in r.items() if not k.startswith("_")},
                       "makespan_ratio": r["makespan_s"] / free["makespan_s"],
                       "same_tree": r["_tree"] == free["_tree"]}
                rows.append(row)
                print_row(row, header)
                header = False
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(rows, indent=1))
    worst = max((r["makespan_ratio"] for r in rows if r["pool"] == "constrained" and r["prefix_caching"]), default=None)
    if worst is not None:
        print(f"worst constrained/unconstrained makespan with prefix caching: {worst:.2f}x (goal <= 1.5x)")
    return rows


def print_row(r: dict, header: bool) -> None:
    if header:
        print(f"{'policy':<8} {'prefix$':>7} {'pool':>13} {'blocks':>6} {'preempt':>8} {'recomputed':>11} "
              f"{'prefix hit':>11} {'prefill':>9} {'logical':>8} {'makespan s':>10} {'x unconstr':>10} "
              f"{'same tree':>9} {'wall s':>7}")
    print(f"{r['policy']:<8} {'on' if r['prefix_caching'] else 'off':>7} {r['pool']:>13} {r['kv_blocks']:>6} "
          f"{r['preemptions']:>8} {r['recomputed_prefill_tokens']:>11} {r['prefix_hit_tokens']:>11} "
          f"{r['prefill_tokens']:>9} {r['logical_tokens']:>8} {r['makespan_s']:>10.2f} {r['makespan_ratio']:>10.2f} "
          f"{'yes' if r['same_tree'] else 'no':>9} {r['wall_s']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
