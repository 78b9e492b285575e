"""How steady is the speed probe? ``python -m runners.bench_probe [--rounds 12] [--reps N]``

The speed probe (``specscale.engine.torch.profiler.speed_probe``) reads how fast this machine
is now; profiles record it, the fidelity check divides every torch run by its ratio, and
``engine.rescale_to_probe`` rescales a profile by it. This benchmark times it alternately on
the engine the profiler builds (large KV pools) and on the engine a short serving cell
builds (the fidelity check's pools), and prints both series, their medians and spreads:
whether the probe depends on the engine it runs on, and how noisy one reading is.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Optional, Sequence

from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.engine.torch.profiler import speed_probe
from runners.profile_engine import CPU_POOLS, serving_cell

# The engine the profiler times its grid and probe on, and a host-fit serving cell's engine.
PROFILER = ("engine=torch", "engine.prm_prefix_cache=true", *CPU_POOLS, "model=tiny", "n_problems=1",
            "progress=false", "wandb.mode=disabled")
SERVING = ("engine=torch", "engine.synthetic_tokens=true", "engine.prm_prefix_cache=true",
           *serving_cell(["model=tiny"], "nonspec", 6, 8, 8))


def _spread(xs: Sequence[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=None, help="the probe's repetitions (default: speed_probe's own)")
    args = ap.parse_args(argv)
    a = build_server(compose_config(list(PROFILER), resolve=True)).backend
    b = build_server(compose_config(list(SERVING), resolve=True)).backend
    pa, pb = [], []
    reps = {"reps": args.reps} if args.reps else {}
    for _ in range(args.rounds):  # alternated: a drift of the machine's speed hits both series alike
        pa.append(speed_probe(a.runner, a.prm, **reps))
        pb.append(speed_probe(b.runner, b.prm, **reps))
    print("profiler engine probe ms:", [round(x * 1e3, 2) for x in pa])
    print("serving engine probe ms: ", [round(x * 1e3, 2) for x in pb])
    print(f"medians {statistics.median(pa) * 1e3:.2f} / {statistics.median(pb) * 1e3:.2f} ms, ratio "
          f"{statistics.median(pb) / statistics.median(pa):.3f}; spread (max-min)/median {_spread(pa):.2f} / "
          f"{_spread(pb):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
