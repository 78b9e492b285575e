"""Fit the sim's synthetic workload to the testbed, then check the sim's accuracy vs beam.

    python -m runners.fit_testbed_workload [--model testbed|testbed_levels] [--fit-problems 200]
        [--fit-searches 3] [--beam 8] [--seed 0] [--yaml conf/synthetic/<model>.yaml] [--out results/<model>]
        [--compare-beams 1,2,4,8,16] [--policies nonspec,ep] [--sim-problems 1000] [--compare-only]

``--model`` is a testbed pair (``specscale.settings.pairings.TESTBED_PAIRS``: ``testbed`` on
``dataset=arith``, ``testbed_levels`` on ``dataset=arith_levels``); the fit is that pair's
fitted workload (``synthetic=<its group>``).

1. Traces: PRM-guided beam search (engine=torch, the pair, policy=nonspec) on
   ``--fit-problems`` problems of its task drawn with their own seed (never a question of a
   held-out split, which the comparison measures on; the levels pair's in equal shares of
   levels 1-5), each searched
   ``--fit-searches`` times with independent seeds (a problem's difficulty is what
   persists across its searches), each member labelled by
   checking its step against the reference (``specscale.testbed.traces``).
2. Fit (``specscale.calibration.workload_fit``): step lengths, steps per path, sibling token
   overlap, the share of steps siblings write identically, exact-1.0 share, on/off-track
   score laws, how often steps take their round's right or wrong score (through the sim:
   the traces' score equality beside the sim's unshared one), the PRM's sensitivity to a
   step's own correctness (through the sim: the value at which the sim's search ranks a
   round's steps as the testbed's PRM does), each problem's own solution length, the step
   hazard's law (difficulty across problems, decay across rounds, correlation between
   siblings), wrong answers, prompt lengths; every key of
   ``engine.synthetic`` it fits is written, as the config group ``synthetic=testbed``
   (``--yaml``, with a header naming the runs and this command) and as
   ``<out>/workload_fit.json`` (the fit's inputs and checks, among them the outcome check:
   the fitted sim's coverage, selection and per-problem outcomes at the fit's own setting
   beside the traces', ``specscale.calibration.outcome_check``).
3. Compare: ``engine=sim model=<pair> synthetic=<its group>`` at every beam and policy on
   ``--sim-problems`` synthetic problems vs the accuracy measured on the testbed
   (``<out>/requests.csv`` of ``runners.bench_testbed --out``): ``<out>/sim_vs_measured.csv``.
   A prediction outside the measured 95% interval is a miss and is reported as one.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from analysis import testbed_tables as T
from analysis.stats import t_interval, wilson_interval
from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.data.arith import held_out_questions, level_problems, levels_held_out_questions, problems, row
from specscale.settings.pairings import testbed_pair

FIT_SEED = 7  # the fit's problems: a stream of their own, disjoint from the test split
QUIET = ("progress=false", "wandb.mode=disabled")


def common(model: str) -> tuple[str, ...]:
    """The overrides every run of the fit shares: the pair, its task, quiet."""
    return (f"model={model}", f"dataset={testbed_pair(model).dataset}", *QUIET)


def fit_problem_file(n: int, directory: Path, dataset: str = "arith") -> Path:
    """``n`` problems of ``dataset``'s task from the fit's own stream (``FIT_SEED``), none of
    them a question of a held-out split; arith_levels draws levels 1-5 in equal shares."""
    if dataset == "arith_levels":
        levels = level_problems(FIT_SEED, exclude=levels_held_out_questions())
        rows = [row(p, i, "fit", level) for i, (level, p) in zip(range(n), levels)]
    else:
        stream = problems(FIT_SEED, exclude=held_out_questions())
        rows = [row(next(stream), i, "fit") for i in range(n)]
    path = directory / f"{dataset}_fit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def traces(args, data_file: Path, seed: int):
    from transformers import AutoTokenizer

    from specscale.data.loader import load_problems
    from specscale.engine.checkpoints import resolve_checkpoint
    from specscale.testbed.traces import member_frame

    cfg = compose_config(["engine=torch", *common(args.model), "policy=nonspec", f"beam={args.beam}",
                          f"expansion={min(4, args.beam)}", f"n_problems={args.fit_problems}", f"seed={seed}",
                          f"dataset.data_files={data_file}"], resolve=True)  # fmt: skip
    rec = build_server(cfg).run()
    probs = load_problems(cfg["dataset"], n_problems=args.fit_problems)
    tok = AutoTokenizer.from_pretrained(str(resolve_checkpoint(cfg["model"]["generator"]["hf_name"],
                                                                           "generator")))
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    members = member_frame(rec.rounds, rec.requests, {p.id: p.problem for p in probs}, decode,
                           seed, args.beam, min(4, args.beam))  # fmt: skip
    return members, rec


SEARCH_STRIDE = 1_000_000  # request ids of search k start at k * SEARCH_STRIDE


def repeated_traces(args, data_file: Path) -> tuple[pd.DataFrame, list[dict]]:
    """``--fit-searches`` independent searches (seeds seed, seed+1, ...) of every fit
    problem, their members in one frame: request ids (and sibling groups) made distinct
    per search, problem ids shared, so the fit can tell a problem that is hard in every
    search (difficulty) from a group whose children fail together (correlation)."""
    frames, requests = [], []
    for k in range(args.fit_searches):
        members, rec = traces(args, data_file, args.seed + k)
        off = k * SEARCH_STRIDE
        members = members.assign(request_id=members["request_id"] + off)
        members["group"] = [(rid, parent) for rid, parent in zip(members["request_id"], members["parent"])]
        frames.append(members)
        requests += [{**r, "request_id": r["request_id"] + off} for r in rec.requests]
    return pd.concat(frames, ignore_index=True), requests


def sim_within_round_auc(sensitivity: float, args) -> float:
    """The sim's ``within_round_auc`` on the fitted testbed workload (``synthetic=testbed``)
    with ``prm_step_sensitivity`` set: the same search (beam, expansion) as the traces."""
    from specscale.calibration.sim_traces import sim_member_frame
    from specscale.calibration.workload_fit import within_round_auc

    cfg = compose_config(["engine=sim", *common(args.model), f"synthetic={args.synthetic}", "policy=nonspec",
                          f"beam={args.beam}", f"expansion={min(4, args.beam)}",
                          f"n_problems={args.sensitivity_problems}", f"seed={args.seed}",
                          f"engine.synthetic.prm_step_sensitivity={sensitivity}"], resolve=True)  # fmt: skip
    server = build_server(cfg)
    server.run()
    return within_round_auc(sim_member_frame(server))


def fit_prm_step_sensitivity(target: float, args) -> dict:
    """``prm_step_sensitivity`` such that the sim's search ranks the steps of a round as
    the testbed's PRM does (its within-round AUC: a statistic of the traces), by Brent's
    method on [0.02, 1]; at a bound when the target is outside what the sim reaches."""
    from scipy.optimize import brentq

    f = lambda x: sim_within_round_auc(x, args) - target  # noqa: E731
    lo, hi = 0.02, 1.0
    f_lo, f_hi = f(lo), f(hi)
    if f_hi <= 0:
        return {"value": hi, "status": "target at or above the sim's with a fully sensitive PRM"}
    if f_lo >= 0:
        return {"value": lo, "status": "target below the sim's least sensitive PRM"}
    value = float(brentq(f, lo, hi, xtol=0.01))
    return {"value": value, "status": "converged", "sim_auc": float(f(value) + target), "target_auc": float(target)}


def sim_searches(args, extra=(), beam: int | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """The fitted sim (``synthetic=<the --yaml's name>`` plus ``extra`` overrides) in the traces'
    design: ``--fit-searches`` seeds of the same search (``beam``, default the fit's) on
    as many problems, members and requests numbered as ``repeated_traces`` numbers them."""
    from specscale.calibration.sim_traces import sim_member_frame

    beam = beam or args.beam
    frames, sim_requests = [], []
    for k in range(args.fit_searches):
        cfg = compose_config(["engine=sim", *common(args.model), f"synthetic={args.synthetic}", "policy=nonspec",
                              f"beam={beam}", f"expansion={min(4, beam)}", f"n_problems={args.fit_problems}",
                              f"seed={args.seed + k}", *extra], resolve=True)  # fmt: skip
        server = build_server(cfg)
        rec = server.run()
        off = k * SEARCH_STRIDE
        m = sim_member_frame(server)
        frames.append(m.assign(request_id=m["request_id"] + off))
        sim_requests += [{**r, "request_id": r["request_id"] + off} for r in rec.requests]
    return pd.concat(frames, ignore_index=True), sim_requests


def fit_round_scores(on_equality: float, off_equality: float, args) -> dict:
    """``round_score_share`` and ``wrong_score_overlap`` from the traces' on- and
    off-track score equality (statistics of the traces) and the sim's with no shared
    score in the same design (``workload_fit.shared_score_share``, ``wrong_score_overlap``)."""
    from specscale.calibration.workload_fit import score_equality, shared_score_share, wrong_score_overlap

    members = sim_searches(args, ["++engine.synthetic.round_score_share=0"])[0]
    on0, off0 = score_equality(members), score_equality(members, on_track=False)
    share = shared_score_share(on_equality, on0)
    return {"round_score_share": share, "wrong_score_overlap": wrong_score_overlap(off_equality, off0, share),
            "on_track_equality": float(on_equality), "off_track_equality": float(off_equality),
            "sim_unshared_on_track_equality": float(on0), "sim_unshared_off_track_equality": float(off0)}  # fmt: skip


def outcome_check(members: pd.DataFrame, requests: list[dict], args) -> dict:
    """The fitted sim's search outcomes beside the traces' at the fit's own setting (beam,
    expansion, ``--fit-searches`` seeds, as many problems): coverage, selection and how a
    problem's outcome repeats across searches (``specscale.calibration.outcome_check``)."""
    from specscale.calibration.outcome_check import outcome_stats

    out = {"testbed": outcome_stats(members, requests), "sim": outcome_stats(*sim_searches(args))}
    for who, st in out.items():
        print(f"  {who:<7} accuracy {st['accuracy']:.3f}  coverage {st['coverage']:.3f}  "
              f"P(correct | covered) {st['correct_given_covered']}  problems by covered searches "
              f"{st['problems_by_covered_searches']}", flush=True)
    return out


def scaling_check(args, fit_requests: list[dict], sim_acc) -> list[dict]:
    """Accuracy vs beam on the fit problems (engine=torch, ``--fit-searches`` seeds; the
    fit's own beam reuses its traces) beside the fitted sim's on ``--sim-problems``
    synthetic problems: how the search's gain with beam comes out, checked on the data
    the fit was made on (a development check: the held-out comparison is ``compare`` on
    the test split). The testbed's interval is over problems (a t interval of each
    problem's mean over its searches: the searches of one problem are not independent),
    the sim's a Wilson interval (one search per problem)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data_file = fit_problem_file(args.fit_problems, Path(tmp), args.dataset)
        for beam in args.check_beams:
            if beam == args.beam:
                measured = fit_requests
            else:
                measured = []
                for k in range(args.fit_searches):
                    cfg = compose_config(["engine=torch", *common(args.model), "policy=nonspec", f"beam={beam}",
                                          f"expansion={min(4, beam)}", f"n_problems={args.fit_problems}",
                                          f"seed={args.seed + k}", f"dataset.data_files={data_file}"],
                                         resolve=True)  # fmt: skip
                    measured += build_server(cfg).run().requests
            per_problem = pd.DataFrame(measured).groupby("problem_id")["correct"].mean()
            lo, hi = t_interval(per_problem.to_numpy(dtype=float))
            row = {"beam": beam, "testbed_accuracy": float(per_problem.mean()), "testbed_ci_low": lo,
                   "testbed_ci_high": hi, "testbed_problems": len(per_problem), "testbed_searches": len(measured)}
            k, n = sim_acc("nonspec", beam)
            lo, hi = wilson_interval(k, n)
            row.update({"sim_accuracy": k / n, "sim_ci_low": lo, "sim_ci_high": hi, "sim_problems": n})
            row["sim_within_testbed_ci"] = bool(row["testbed_ci_low"] <= row["sim_accuracy"] <= row["testbed_ci_high"])
            rows.append(row)
            print(f"  beam {beam:>2}: testbed {row['testbed_accuracy']:.3f} [{row['testbed_ci_low']:.3f}, "
                  f"{row['testbed_ci_high']:.3f}]  sim {row['sim_accuracy']:.3f}"
                  f"{'' if row['sim_within_testbed_ci'] else '  outside'}", flush=True)
    return rows


def write_yaml(path: Path, fitted, meta: dict) -> None:
    header = (
        "# @package _global_\n"
        "# Synthetic-workload profile FITTED BY CODE from testbed search traces: select it\n"
        f"# with `synthetic={meta['synthetic']}` (e.g. python run.py engine=sim model={meta['model']} "
        f"synthetic={meta['synthetic']}).\n"
        f"# Written by: {meta['command']}\n"
        f"# Runs: engine=torch model={meta['model']} policy=nonspec beam={meta['beam']} "
        f"expansion={meta['expansion']} seeds {meta['seed']}..{meta['seed'] + meta['fit_searches'] - 1} on "
        f"{meta['fit_problems']}\n# {meta['dataset']} problems of seed {FIT_SEED} (disjoint from the held-out "
        f"splits); {meta['members']} round members, {meta['finished_paths']} finished paths.\n"
        f"# Do not edit by hand: rerun the command. Fit details and checks: {meta['out']}/workload_fit.json.\n"
    )
    body = {"engine": {"synthetic": fitted.synthetic, "problems": fitted.problems},
            "dataset": {"sim": fitted.dataset_sim}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None))


def sim_accuracy(args, policy: str, beam: int) -> tuple[int, int]:
    """(correct, searches) of the fitted sim on ``--sim-problems`` problems, one search each."""
    cfg = compose_config(["engine=sim", *common(args.model), f"synthetic={args.synthetic}", f"policy={policy}",
                          f"beam={beam}", f"expansion={min(4, beam)}", f"n_problems={args.sim_problems}",
                          f"seed={args.seed}"],
                         resolve=True)  # fmt: skip
    rec = build_server(cfg).run()
    return sum(bool(r["correct"]) for r in rec.requests), len(rec.requests)


def compare(args, sim_acc) -> pd.DataFrame:
    measured = T.accuracy_vs_beam(pd.read_csv(Path(args.out) / "requests.csv"))
    rows = []
    for policy in args.policies:
        for beam in args.compare_beams:
            k, n = sim_acc(policy, beam)
            m = measured[(measured["policy"] == policy) & (measured["beam"] == beam)]
            if not len(m):
                print(f"  no measured accuracy for {policy} beam {beam}: skipped", flush=True)
                continue
            m = m.iloc[0]
            lo, hi = wilson_interval(k, n)
            rows.append({"policy": policy, "beam": beam, "n": int(m["n"]), "accuracy": m["accuracy"],
                         "ci_low": m["ci_low"], "ci_high": m["ci_high"], "sim_n": n, "sim_accuracy": k / n,
                         "sim_ci_low": lo, "sim_ci_high": hi,
                         "within_measured_ci": bool(m["ci_low"] <= k / n <= m["ci_high"])})  # fmt: skip
            print(f"  {policy:<8} beam {beam:>2}: measured {m['accuracy']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
                  f"  sim {k / n:.3f}{'' if rows[-1]['within_measured_ci'] else '  MISS'}", flush=True)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="testbed", help="the testbed pair to fit: testbed (dataset=arith) or "
                    "testbed_levels (dataset=arith_levels)")
    ap.add_argument("--fit-problems", type=int, default=200)
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fit-searches", type=int, default=3, help="independent searches of every fit problem "
                    "(seeds seed, seed+1, ...): a problem's difficulty is what stays across them")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--yaml", default=None, help="default conf/synthetic/<the pair's group>.yaml")
    ap.add_argument("--out", default=None, help="default results/<model>")
    ap.add_argument("--compare-beams", default="1,2,4,8,16")
    ap.add_argument("--check-beams", default="1,2,4,8,16", help="beams of the accuracy check on the fit problems "
                    "(testbed vs the fitted sim; empty: none)")
    ap.add_argument("--policies", default="nonspec,ep")
    ap.add_argument("--sim-problems", type=int, default=1000)
    ap.add_argument("--sensitivity-problems", type=int, default=400, help="sim problems per evaluation of the "
                    "PRM sensitivity fit")
    ap.add_argument("--compare-only", action="store_true", help="skip the fit; compare with the current profile")
    ap.add_argument("--text-mechanisms", action="store_true", help="also fit the siblings' per-position overlap and "
                    "shared lengths (deduplication as the testbed's; its accuracy check then falls low: "
                    "specscale.calibration.workload_fit.fit says why); write it with --yaml to a profile of its own")
    args = ap.parse_args(argv)
    command = "python -m runners.fit_testbed_workload " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    try:
        pair = testbed_pair(args.model)
    except KeyError as exc:
        ap.error(str(exc))
    args.dataset = pair.dataset
    args.yaml = args.yaml or f"conf/synthetic/{pair.synthetic}.yaml"
    args.out = args.out or f"results/{args.model}"
    args.compare_beams = [int(b) for b in args.compare_beams.split(",")]
    args.check_beams = [int(b) for b in args.check_beams.split(",") if b]
    # The sim reads the profile back as a config group: --yaml must be conf/synthetic/<name>.yaml.
    if Path(args.yaml).parent.resolve() != (Path(__file__).resolve().parents[1] / "conf" / "synthetic"):
        ap.error(f"--yaml {args.yaml}: the profile must live in conf/synthetic/ (the sim composes synthetic=<name>)")
    args.synthetic = Path(args.yaml).stem
    args.policies = args.policies.split(",")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # The fitted sim's accuracy per (policy, beam), once: the fit check and the comparison
    # read the same runs (the profile is final by the time either runs).
    sim_acc = functools.cache(lambda policy, beam: sim_accuracy(args, policy, beam))
    if not args.compare_only:
        from specscale.calibration.workload_fit import fit

        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            members, requests = repeated_traces(args, fit_problem_file(args.fit_problems, Path(tmp), args.dataset))
        answers = {r["problem_id"]: str(r["reference"]) for r in requests}
        fitted = fit(members, [r["prompt_tokens"] for r in requests], answers, text_mechanisms=args.text_mechanisms)
        meta = {"command": command, "model": args.model, "dataset": args.dataset, "synthetic": args.synthetic,
                "out": args.out, "beam": args.beam,
                "expansion": min(4, args.beam), "seed": args.seed,
                "fit_searches": args.fit_searches, "fit_problems": args.fit_problems, "fit_seed": FIT_SEED,
                "members": len(members), "finished_paths": fitted.checks["finished_paths"],
                "search_accuracy_on_fit_problems": sum(bool(r["correct"]) for r in requests) / len(requests),
                "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
        write_yaml(Path(args.yaml), fitted, meta)  # the sim below reads it
        # What the traces cannot give alone: how often steps take their round's right or
        # wrong score (beside the sim's chance of paths coinciding without it), then the
        # PRM's sensitivity to a step's own correctness, fitted through the sim to the
        # traces' within-round ranking.
        shared = fit_round_scores(fitted.checks["on_track_score_equality"], fitted.checks["off_track_score_equality"],
                                  args)  # fmt: skip
        for k in ("round_score_share", "wrong_score_overlap"):
            fitted.synthetic[k] = round(shared[k], 4)
        fitted.checks["round_scores_fit"] = shared
        print("round scores: " + ", ".join(f"{k} {v:.4f}" for k, v in shared.items()), flush=True)
        write_yaml(Path(args.yaml), fitted, meta)
        sens = fit_prm_step_sensitivity(fitted.checks["within_round_auc"], args)
        fitted.synthetic["prm_step_sensitivity"] = round(float(sens["value"]), 4)
        fitted.checks["prm_step_sensitivity_fit"] = sens
        print(f"prm_step_sensitivity {sens['value']:.4f} ({sens['status']})", flush=True)
        write_yaml(Path(args.yaml), fitted, meta)
        print("search outcomes on the fit problems (a check of the fit, not a validation):", flush=True)
        fitted.checks["outcome_check"] = outcome_check(members, requests, args)
        if args.check_beams:
            print("accuracy vs beam on the fit problems (a check of the fit, not a validation):", flush=True)
            fitted.checks["scaling_check"] = scaling_check(args, requests, sim_acc)
        (out / "workload_fit.json").write_text(json.dumps({**meta, **fitted.as_dict()}, indent=1) + "\n")
        print(yaml.safe_dump(fitted.as_dict(), sort_keys=False, default_flow_style=None))
        print(f"wrote {args.yaml} and {out / 'workload_fit.json'}")
    if not (out / "requests.csv").is_file():
        if args.model != "testbed":  # runners.bench_testbed measures model=testbed on dataset=arith only
            print(f"model={args.model}: its held-out comparison is the search-family experiment on its test split "
                  "(python run.py -m +experiment=search_family; results/search_family/README.md)")
            return 0
        print(f"no measured record in {out} (python -m runners.bench_testbed --n-problems 500 --out {out}): "
              "rerun with --compare-only once it exists")
        return 1
    df = compare(args, sim_acc)
    df.to_csv(out / "sim_vs_measured.csv", index=False)
    inside = int(df["within_measured_ci"].sum()) if len(df) else 0
    print(f"sim vs measured: {inside}/{len(df)} inside the measured 95% interval; wrote {out / 'sim_vs_measured.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
