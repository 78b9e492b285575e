"""PRM input tokens per logical token with the PRM prefix cache on and off (engine=torch).

    python -m runners.bench_prm_cache [--model tiny] [--policies nonspec,full] [--beam 8]
        [--n-problems 4] [--concurrency 4] [--set KEY=VALUE ...] [--json OUT]

Runs each policy twice on the same problems and seed, ``engine.prm_prefix_cache=true``
then ``false``, and prints per run: logical tokens, PRM input tokens (what the PRM
computed), their ratio, PRM tokens read from the cache, verification seconds, makespan
and ``output_tok_s``; then the on/off ratios. The search tree is the same in both runs
(the cache changes cost, never scores), so the token ratio is the cache's saving.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specscale.cell import run_cell
from specscale.compose import compose_config

SHOWN = ("logical_tokens", "prm_tokens", "prm_tokens_per_logical_token", "prm_cached_tokens", "prm_invocations",
         "prm_cache_evictions", "time_verification_s", "makespan_s", "output_tok_s", "prm_kv_peak_blocks")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--policies", default="nonspec,full")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--n-problems", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    base = ["engine=torch", f"model={args.model}", f"beam={args.beam}", f"concurrency={args.concurrency}",
            f"n_problems={args.n_problems}", f"seed={args.seed}", "progress=false", "wandb.mode=disabled", *args.set]
    rows = []
    print(f"{'policy':<8} {'cache':>5} {'logical':>8} {'PRM tok':>8} {'PRM/logical':>11} {'cached':>8} "
          f"{'PRM calls':>9} {'evict':>6} {'verify s':>8} {'makespan s':>10} {'out tok/s':>9}")
    for policy in args.policies.split(","):
        pair = {}
        for cache in (True, False):
            cfg = compose_config([*base, f"policy={policy}", f"engine.prm_prefix_cache={str(cache).lower()}"],
                                 resolve=True)
            s = run_cell(cfg)
            row = {"policy": policy, "prm_prefix_cache": cache, **{k: s[k] for k in SHOWN}}
            rows.append(row)
            pair[cache] = row
            print(f"{policy:<8} {'on' if cache else 'off':>5} {row['logical_tokens']:>8} {row['prm_tokens']:>8} "
                  f"{row['prm_tokens_per_logical_token']:>11.2f} {row['prm_cached_tokens']:>8} "
                  f"{row['prm_invocations']:>9} {row['prm_cache_evictions']:>6} {row['time_verification_s']:>8.2f} "
                  f"{row['makespan_s']:>10.2f} {row['output_tok_s']:>9.1f}")
        on, off = pair[True], pair[False]
        print(f"{policy:<8} off/on: PRM tokens x{off['prm_tokens'] / max(on['prm_tokens'], 1):.1f}, verification "
              f"x{off['time_verification_s'] / max(on['time_verification_s'], 1e-9):.2f}, makespan "
              f"x{off['makespan_s'] / max(on['makespan_s'], 1e-9):.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
