"""`python -m specscale.calibration`: fit the sim's constants to the calibration targets.

    python -m specscale.calibration [--n-problems N] [--seeds 0,1,2] [--jobs 2] [--max-evals 60] [--refine 6]
        [--variants cache_on,cache_off,tokenize_overlapped] [--out results/calibration]
        [--write-profile conf/engine/sim.yaml]

Fits the constants of ``specscale.calibration.params.SIM_PARAMS`` (at most 8) with
``scipy.optimize.least_squares`` to ``specscale.calibration.targets.CALIBRATION`` only:
the validation protocol's calibrate set (results/validation/protocol.yaml), checked
again here before anything runs, so no other target can be fitted. ``n_problems`` and
the seeds default to the protocol's (a prediction is the mean over the seeds). One fit
per structural variant (PRM prefix cache on/off; PRM input building on the critical
path or overlapped), starting from the roofline guesses (conf/engine/sim_roofline.yaml).
The variant with the lower cost is chosen; every variant's fit is reported with scipy's
status (a fit that stopped on ``--max-evals`` says so: it has not converged). Writes
``<out>/sim_calibration.json`` (fitted values with bounds, every target's residual, each
fit's status, the protocol's version and hash) and, with ``--write-profile``, an engine
profile that inherits the roofline guesses and overrides the fitted constants.
Deterministic for its seeds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from specscale.calibration.evaluate import Evaluator, table
from specscale.calibration.fit import FitResult, fit
from specscale.calibration.params import SIM_PARAMS, overrides_for
from specscale.calibration.protocol import parse_seeds, protocol
from specscale.calibration.targets import CALIBRATION, Target, check_fittable
from specscale.compose import CONF_DIR, compose_config

VARIANTS = {
    "cache_on": ("engine.prm_prefix_cache=true", "engine.cost.host_prm_on_critical_path=true"),
    "cache_off": ("engine.prm_prefix_cache=false", "engine.cost.host_prm_on_critical_path=true"),
    "tokenize_overlapped": ("engine.prm_prefix_cache=true", "engine.cost.host_prm_on_critical_path=false"),
}


def roofline_start() -> list[float]:
    """The starting constants: the roofline profile's guesses."""
    eng = compose_config(["engine=sim_roofline"], resolve=True)["engine"]
    out = []
    for p in SIM_PARAMS:
        node = eng
        # A pair's own constant starts from the profile's shared value of the same key.
        for part in (f"synthetic.{p.key}" if p.model else p.key).split("."):
            node = node[part]
        out.append(min(max(float(node), p.low), p.high))
    return out


def fitted_targets() -> tuple[Target, ...]:
    """What a fit uses: the calibration targets, each checked to be in the protocol's
    calibrate set (a target of any other set raises before a cell runs)."""
    return check_fittable(CALIBRATION)


def run_variant(name: str, args, start: list[float], max_evals: int) -> FitResult:
    t0 = time.perf_counter()
    targets = fitted_targets()

    def progress(n: int, cost: float) -> None:
        print(f"  [{name}] evaluation {n:>3}  cost {cost:10.4f}  ({time.perf_counter() - t0:6.0f} s)", flush=True)

    with Evaluator(n_problems=args.n_problems, seeds=args.seeds, jobs=args.jobs, measure_overlap=True,
                   base=("engine=sim_roofline", *VARIANTS[name])) as ev:
        return fit(SIM_PARAMS, targets,
                   lambda values: ev.predict(targets, overrides_for(SIM_PARAMS, values)),
                   start, max_evals=max_evals, progress=progress)


def print_fit(name: str, res: FitResult) -> None:
    state = "converged" if res.converged else "NOT converged"
    print(f"\n== {name}: cost {res.cost:.4f} after {res.evaluations} evaluations, status {res.status} ({state}: "
          f"{res.message})")
    if res.status == 0:
        print(f"WARNING: {name} stopped on its evaluation limit before converging; its constants are where the "
              "search was cut off, not a fit (raise --max-evals / --refine)")
    for p, v, s in zip(res.params, res.values, res.start):
        flag = "  AT BOUND" if p.at_bound(v) else ""
        print(f"  {p.name:<34} {v:12.6g}   (start {s:.6g}, bounds [{p.low:g}, {p.high:g}]){flag}")
    for row in table(res.targets, res.predicted):
        print(f"  {'ok  ' if row['pass'] else 'MISS'} {row['target']:<46} paper {str(row['paper']):>8} "
              f"predicted {row['predicted']:10.4g} {row['unit']:<6} {row['rule']}")


def profile_yaml(res: FitResult, variant: str, args) -> str:
    lines = [
        "# Calibrated sim profile, written by `python -m specscale.calibration` "
        f"(variant {variant}, n_problems={args.n_problems}, seeds={list(args.seeds)}, "
        f"protocol v{protocol().version} {protocol().hash}).",
        "# The constants below were FITTED to the calibration targets of specscale/calibration/targets.py",
        "# (see results/calibration/sim_calibration.json for residuals and bounds); every other constant",
        "# is the roofline profile's MODEL guess (conf/engine/sim_roofline.yaml).",
        "defaults:", "  - sim_roofline", "  - _self_", "",
    ]
    groups: dict[str, dict[str, object]] = {}
    for o in VARIANTS[variant]:
        key, val = o.split("=", 1)
        parts = key.split(".")[1:]
        groups.setdefault(parts[0] if len(parts) > 1 else "", {})[parts[-1]] = val
    for key, val in groups.pop("", {}).items():
        lines.append(f"{key}: {val}")
    for p, v in zip(res.params, res.values):
        if p.model:  # a pair's own constant lives in its model config (write_model_workload)
            continue
        group, name = p.key.split(".", 1)
        groups.setdefault(group, {})[name] = f"{v:.6g}"
    for group, vals in groups.items():
        lines.append(f"{group}:")
        lines.extend(f"  {k}: {v}" for k, v in vals.items())
    return "\n".join(lines) + "\n"


def write_model_workload(text: str, key: str, value: float, note: str) -> str:
    """A model config's text with ``sim.workload.<key>`` set to value (the node created
    under ``sim:`` if absent; other lines kept as they are)."""
    lines = text.splitlines()
    entry = f"    {key}: {value:.6g}   # {note}"
    try:
        sim = lines.index("sim:")
    except ValueError:
        raise ValueError("the model config has no top-level 'sim:' node") from None
    end = next((i for i in range(sim + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    wl = next((i for i in range(sim + 1, end) if lines[i].startswith("  workload:")), None)
    if wl is None:
        lines[end:end] = ["  workload:                    # this pair's own synthetic-workload values "
                          "(over engine.synthetic)", entry]
    else:
        stop = next((i for i in range(wl + 1, end) if not lines[i].startswith("    ")), end)
        hit = next((i for i in range(wl + 1, stop) if lines[i].strip().startswith(f"{key}:")), None)
        if hit is None:
            lines.insert(stop, entry)
        else:
            lines[hit] = entry
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specscale.calibration", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    proto = protocol()
    ap.add_argument("--n-problems", type=int, default=proto.n_problems, help="problems per cell (default: the "
                    f"protocol's, {proto.n_problems})")
    ap.add_argument("--seeds", type=parse_seeds, default=proto.seeds, help="comma-separated seeds; a prediction is "
                    f"the mean over them (default: the protocol's, {','.join(map(str, proto.seeds))})")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--max-evals", type=int, default=60, help="least_squares max_nfev per variant (each "
                    "iteration also runs one evaluation per constant for the Jacobian); a fit that reaches it "
                    "has not converged and is reported so")
    ap.add_argument("--refine", type=int, default=6, help="max_nfev of a second fit of the chosen variant, "
                    "started from its first fit (0: none)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="results/calibration")
    ap.add_argument("--write-profile", default=None, help="engine profile to write (e.g. conf/engine/sim.yaml)")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown --variants {unknown}; choose from {sorted(VARIANTS)}")
    if (args.n_problems, tuple(args.seeds)) != (proto.n_problems, proto.seeds):
        print(f"note: n_problems={args.n_problems}, seeds={list(args.seeds)} differ from the protocol's "
              f"(n_problems={proto.n_problems}, seeds={list(proto.seeds)})", flush=True)
    targets = fitted_targets()
    start = roofline_start()
    fits = {}
    for name in variants:
        print(f"fitting variant {name} ({len(SIM_PARAMS)} constants, {len(targets)} targets)", flush=True)
        fits[name] = run_variant(name, args, start, args.max_evals)
        print_fit(name, fits[name])
    best = min(fits, key=lambda k: fits[k].cost)
    if args.refine:
        print(f"\nrefining {best} from its fit ({args.refine} more evaluations at most)", flush=True)
        refined = run_variant(best, args, fits[best].values, args.refine)
        refined.start = fits[best].start
        if refined.cost < fits[best].cost:
            fits[best] = refined
        print_fit(f"{best} (refined)", fits[best])
    print(f"\nchosen variant: {best} (lowest cost; {', '.join(f'{k} {v.cost:.4f}' for k, v in fits.items())})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"chosen": best, "converged": fits[best].converged, "n_problems": args.n_problems,
              "seeds": list(args.seeds), "protocol_version": proto.version, "protocol_hash": proto.hash,
              "variants": {k: {"overrides": list(VARIANTS[k]), **v.as_dict()} for k, v in fits.items()}}
    (out / "sim_calibration.json").write_text(json.dumps(report, indent=1, default=float))
    print(f"wrote {out / 'sim_calibration.json'}")
    if args.write_profile:
        Path(args.write_profile).write_text(profile_yaml(fits[best], best, args))
        print(f"wrote {args.write_profile}")
        for p, v in zip(fits[best].params, fits[best].values):
            if p.model:
                path = CONF_DIR / "model" / f"{p.model}.yaml"
                path.write_text(write_model_workload(path.read_text(), p.key, v, f"FITTED by python -m "
                                                     f"specscale.calibration (protocol v{proto.version})"))
                print(f"wrote {p.name} = {v:.6g} into {path}")
        moved = [p.key for p in SIM_PARAMS if p.key.startswith("synthetic.")]
        if moved:
            print(f"also set {', '.join(moved)} in conf/engine/torch.yaml (synthetic-token mode must keep the sim's "
                  "workload; tests/engine/torch/test_synthetic_tokens.py checks they agree)")
    if not fits[best].converged:
        print(f"WARNING: the chosen fit ({best}) has not converged (status {fits[best].status}: "
              f"{fits[best].message})")
    missed = fits[best].missed
    if missed:
        print(f"{len(missed)} calibration target(s) missed by the chosen fit: " + "; ".join(t.name for t in missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
