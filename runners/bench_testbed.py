"""Accuracy on the CPU testbed (model=testbed, dataset=arith): search vs sampling baselines.

    python -m runners.bench_testbed [--n-problems 100] [--beams 1,2,4,8,16]
        [--policies nonspec,ep_strict,ep,full] [--n 8] [--json OUT] [--out results/testbed]

1. Accuracy vs beam: every policy at every beam (expansion min(4, beam)) through the
   harness (engine=torch, the shipped testbed pair, the default search settings), with
   95% Wilson intervals, the makespan, and McNemar's exact test of each policy against
   nonspec on the same problems (strict policies must agree on every problem).
2. At N = ``--n``: PRM-guided beam search (nonspec, beam N) beside sampling baselines on
   the same problems: a single sample, majority vote over N samples, PRM-weighted vote
   and PRM best-of-N. The N samples are drawn from the same generator with the same
   prompt and temperature as the search (transformers ``generate``); the PRM scores them
   through the harness's ProcessRewardModel (last-step reward, ``score_agg=last``).
3. The PRM's step scores (the same harness PRM) on the N samples' steps, labelled by
   checking them against the reference solution, and on planted-error paths of the same
   problems: the report's step AUC and reliability diagram are computed from them.

With ``--out DIR`` the record the report's "Testbed" section reads is written there
(``specscale.testbed.record``): per-request outcomes and latencies of every cell, the
baselines per problem, the PRM's per-step scores and a ``bench.json`` with the settings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from analysis.stats import mcnemar_test, wilson_interval
from specscale.cell import build_server
from specscale.settings import CellSpec
from specscale.compose import compose_config
from specscale.engine.checkpoints import resolve_checkpoint
from specscale.engine.torch import build as torch_build
from specscale.testbed import record

EVAL_SEED = 99  # planted errors of the held-out problems, as runners.train_testbed draws them


def _cfg(policy: str, beam: int, args) -> dict:
    return compose_config([
        "engine=torch", "model=testbed", f"policy={policy}", f"beam={beam}", f"expansion={min(4, beam)}",
        f"n_problems={args.n_problems}", f"concurrency={args.concurrency}", f"seed={args.seed}",
        "progress=false", "wandb.mode=disabled", *args.set,
    ], resolve=True)  # fmt: skip


def _fmt(k: int, n: int) -> str:
    lo, hi = wilson_interval(k, n)
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def beam_table(args, models) -> list[dict]:
    rows = []
    for beam in args.beams:
        for policy in args.policies:
            spec = CellSpec.from_config(_cfg(policy, beam, args))
            t = time.perf_counter()
            rec = build_server(spec, built=torch_build.build_torch(spec, models=models)).run()
            reqs = sorted(rec.requests, key=lambda r: r["request_id"])
            correct = [bool(r["correct"]) for r in reqs]
            rows.append({"policy": policy, "beam": beam, "expansion": min(4, beam), "correct": correct,
                         "k": sum(correct), "n": len(correct), "makespan_s": rec.makespan_s,
                         "wall_s": time.perf_counter() - t, "requests": reqs,
                         "shortcut_rounds": sum(int(r.get("shortcut_rounds") or 0) for r in reqs)})  # fmt: skip
            print(f"  beam {beam:>2} {policy:<10} acc {_fmt(sum(correct), len(correct))}  "
                  f"makespan {rec.makespan_s:6.1f} s", flush=True)
    return rows


def print_beam_table(rows: list[dict], policies: list[str], beams: list[int]) -> None:
    by = {(r["policy"], r["beam"]): r for r in rows}
    print("\naccuracy vs beam (95% Wilson interval), dataset=arith, model=testbed")
    print("| beam | " + " | ".join(policies) + " |")
    print("|---" * (len(policies) + 1) + "|")
    for b in beams:
        print(f"| {b} | " + " | ".join(_fmt(by[p, b]["k"], by[p, b]["n"]) for p in policies) + " |")
    if "nonspec" not in policies:
        return
    print("\nMcNemar (exact) against nonspec, same problems: only_policy / only_nonspec, p")
    for p in policies:
        if p == "nonspec":
            continue
        cells = []
        for b in beams:
            m = mcnemar_test(by[p, b]["correct"], by["nonspec", b]["correct"])
            cells.append(f"b{b}: {m.only_a}/{m.only_b} p={m.pvalue:.2f}")
        print(f"  {p:<10} " + "; ".join(cells))


def baselines(args, models) -> tuple[dict, list[dict]]:
    """Single sample, majority, PRM-weighted vote and best-of-N over N independent samples;
    also every sampled path's per-step PRM scores and labels (for the step AUC)."""
    from specscale.data.arith import parse_question
    from specscale.data.loader import load_problems
    from specscale.grading import extract_boxed, is_correct
    from specscale.testbed.evaluate import label_steps, sample
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = _cfg("nonspec", args.n, args)
    problems = load_problems(cfg["dataset"], n_problems=args.n_problems)
    gen_dir = resolve_checkpoint(cfg["model"]["generator"]["hf_name"], "generator")
    tok = AutoTokenizer.from_pretrained(str(gen_dir))
    gen = AutoModelForCausalLM.from_pretrained(str(gen_dir)).eval()
    prm = models[1]
    temp = float(cfg["search"]["temperature"])
    qs = [p.problem for p in problems]
    samples = [sample(gen, tok, qs, temperature=temp, seed=args.seed * 1000 + i) for i in range(args.n)]
    out, steps_out = defaultdict(list), []
    for j, p in enumerate(problems):
        texts = [samples[i][j] for i in range(args.n)]
        answers = [extract_boxed(t) for t in texts]
        paths = [label_steps(parse_question(p.problem), t) for t in texts]
        steps = [list(path.steps) or [t] for path, t in zip(paths, texts)]
        scores = prm.score_paths(p.problem, steps)
        rewards = [r[-1] if r else 0.0 for r in scores]
        votes, weights = defaultdict(int), defaultdict(float)
        for a, r in zip(answers, rewards):
            if a is not None:
                votes[a] += 1
                weights[a] += r
        majority = max(votes, key=lambda a: votes[a]) if votes else None  # first of the tied (dict order)
        weighted = max(weights, key=lambda a: weights[a]) if weights else None
        best = answers[max(range(args.n), key=lambda i: rewards[i])]
        out["problem_id"].append(p.id)
        out["level"].append(len(parse_question(p.problem).ops))
        out["single"].append(is_correct(answers[0], p.answer))
        out["per_sample_mean"].append(sum(is_correct(a, p.answer) for a in answers) / args.n)
        out["majority"].append(is_correct(majority, p.answer))
        out["weighted"].append(is_correct(weighted, p.answer))
        out["best_of_n"].append(is_correct(best, p.answer))
        for i, (path, s) in enumerate(zip(paths, scores)):
            if path.steps:
                steps_out += record.step_rows("sampled", f"{p.id}#{i}", path, s)
    return dict(out), steps_out


def planted_steps(args, models) -> list[dict]:
    """The PRM's scores on the held-out problems' reference solutions with planted errors."""
    from specscale.data.arith import parse_question
    from specscale.data.loader import load_problems
    from specscale.testbed.evaluate import planted_paths

    problems = load_problems(_cfg("nonspec", 4, args)["dataset"], n_problems=args.n_problems)
    paths = planted_paths([parse_question(p.problem) for p in problems], EVAL_SEED)
    rows = []
    for p, path in zip(problems, paths):
        rows += record.step_rows("planted", p.id, path, models[1].score_paths(p.problem, [list(path.steps)])[0])
    return rows


def print_baselines(args, base: dict, search: dict) -> None:
    n = len(search["correct"])
    print(f"\nN = {args.n}, {n} problems (95% Wilson intervals)")
    print("| method | accuracy |\n|---|---|")
    print(f"| single sample | {_fmt(sum(base['single']), n)} (mean over the {args.n} samples: "
          f"{sum(base['per_sample_mean']) / n:.3f}) |")
    for name, key in (("majority vote", "majority"), ("PRM-weighted vote", "weighted"), ("PRM best-of-N", "best_of_n")):
        print(f"| {name} | {_fmt(sum(base[key]), n)} |")
    print(f"| PRM beam search (nonspec) | {_fmt(search['k'], n)} |")
    for key in ("majority", "single"):
        m = mcnemar_test(search["correct"], base[key])
        print(f"beam - {key}: {(search['k'] - sum(base[key])) / n:+.3f} (McNemar exact p={m.pvalue:.3g})")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-problems", type=int, default=100)
    ap.add_argument("--beams", default="1,2,4,8,16")
    ap.add_argument("--policies", default="nonspec,ep_strict,ep,full")
    ap.add_argument("--n", type=int, default=8, help="samples / beam for the baseline comparison")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None, help="write the report's record here (e.g. results/testbed)")
    args = ap.parse_args(argv)
    command = "python -m runners.bench_testbed " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    args.beams = [int(b) for b in args.beams.split(",")]
    args.policies = args.policies.split(",")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    models = torch_build.build_models(_cfg("nonspec", 4, args))
    rows = beam_table(args, models)
    print_beam_table(rows, args.policies, args.beams)
    base, sampled_steps = baselines(args, models)
    search = next((r for r in rows if r["policy"] == "nonspec" and r["beam"] == args.n), None)
    if search is None:
        search = beam_table(argparse.Namespace(**{**vars(args), "beams": [args.n], "policies": ["nonspec"]}), models)[0]
        rows.append(search)
    print_baselines(args, base, search)
    result = {"beam_rows": [{k: v for k, v in r.items() if k != "requests"} for r in rows],
              "baselines": base, "n": args.n}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.out:
        steps = sampled_steps + planted_steps(args, models)
        meta = {"command": command, "n_problems": args.n_problems, "beams": args.beams, "policies": args.policies,
                "n": args.n, "concurrency": args.concurrency, "seed": args.seed, "threads": args.threads,
                "set": args.set, "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
        for path in record.write(Path(args.out), rows, base, steps, meta):
            print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
