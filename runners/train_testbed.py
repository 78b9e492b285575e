"""Train the CPU testbed (tokenizer, generator, PRM) and write the shipped checkpoints.

    python -m runners.train_testbed                  # the shipped weights (seed 0)
    python -m runners.train_testbed --out /tmp/tb    # somewhere else
    python -m runners.train_testbed --body-steps 4 --gen-steps 2 --prm-steps 3 --no-eval --out /tmp/x  # smoke run

The generator and the PRM share one language-model training run (the "body"): the shipped
generator is the body after ``--gen-steps`` steps, the PRM starts from the body after
``--body-steps`` and learns to check steps (planted errors, see specscale/testbed/prm_data.py)
while its LM loss keeps it computing. A PRM started from the generator itself shares its
blind spots: measured, its AUC at the generator's first wrong steps was 0.37 (below chance).

Deterministic for a seed and a thread count (step-based schedules, seeded synthetic
data; float reductions depend on the thread count, hence ``--threads``). One thread by
default: on a busy 2-core machine two threads measured ~3x slower per step (they stall
on each other); on an idle one ``--threads 2`` is faster.

Writes ``<out>/generator``, ``<out>/prm`` and ``<out>/training.json`` (times, final
losses, held-out accuracy and PRM AUCs).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from specscale.data.arith import ArithSpec, problems, held_out_problems, held_out_questions
from specscale.testbed import WEIGHTS_DIR, models
from specscale.testbed.checkpoint import save_generator, save_prm
from specscale.testbed.tokenizer import build_tokenizer
from specscale.testbed.train import Schedule, train_generator, train_prm

logger = logging.getLogger("train_testbed")
EVAL_SEED = 99  # held-out planted paths: problems of the test split, errors drawn with this seed


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--body-steps", type=int, default=1600, help="LM steps of the body the PRM starts from")
    ap.add_argument("--gen-steps", type=int, default=700, help="the shipped generator: the body after this many steps")
    ap.add_argument("--prm-steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--gen-lr", type=float, default=3e-3)
    ap.add_argument("--prm-lr", type=float, default=1e-3)
    ap.add_argument("--lm-weight", type=float, default=1.0, help="auxiliary LM loss weight of the PRM")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    return ap.parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    spec, exclude = ArithSpec(), held_out_questions()
    tok = build_tokenizer(args.seed)
    if not 0 < args.gen_steps <= args.body_steps:
        raise SystemExit(f"--gen-steps must be in [1, --body-steps={args.body_steps}], got {args.gen_steps}")
    body = models.generator(tok, args.seed)
    snapshot_at = args.gen_steps if args.gen_steps < args.body_steps else None
    gen_log, snapshot = train_generator(body, tok, Schedule(args.body_steps, args.batch, args.gen_lr), args.seed + 1,
                                        spec, exclude, snapshot_at=snapshot_at)  # fmt: skip
    gen = models.generator(tok, args.seed)
    gen.load_state_dict(snapshot if snapshot is not None else body.state_dict())
    gen.eval()
    prm = models.prm_from_generator(body, args.seed + 2)
    prm_log = train_prm(prm, tok, Schedule(args.prm_steps, args.batch, args.prm_lr), args.seed + 3, spec, exclude,
                        lm_weight=args.lm_weight)  # fmt: skip
    report = {
        "seed": args.seed, "threads": args.threads, "body_steps": args.body_steps, "gen_steps": args.gen_steps, "prm_steps": args.prm_steps,
        "batch": args.batch, "gen_lr": args.gen_lr, "prm_lr": args.prm_lr, "lm_weight": args.lm_weight,
        "body_seconds": round(gen_log.seconds, 1), "prm_seconds": round(prm_log.seconds, 1),
        "generator_loss": gen_log.losses[args.gen_steps - 1], "body_final_loss": gen_log.losses[-1],
        "prm_final_loss": prm_log.losses[-1],
        "parameters": sum(p.numel() for p in gen.parameters()),
    }  # fmt: skip
    if not args.no_eval:
        report.update(evaluate(gen, prm, tok, args.eval_problems, args.seed))
    save_generator(gen, tok, args.out / "generator")
    save_prm(prm, tok, args.out / "prm")
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def evaluate(gen, prm, tok, n: int, seed: int) -> dict:
    from specscale.testbed.evaluate import is_correct, label_steps, planted_paths, prm_scores, sample, step_auc

    t0 = time.perf_counter()
    ps = held_out_problems(n)
    qs = [p.question for p in ps]
    greedy = sample(gen, tok, qs, temperature=0.0, seed=seed)
    sampled = sample(gen, tok, qs, temperature=0.8, seed=seed)
    planted = planted_paths(ps, EVAL_SEED)
    generated = [label_steps(p, t) for p, t in zip(ps, sampled)]
    generated = [g for g in generated if g.steps]
    a_planted = step_auc(planted, prm_scores(prm, tok, planted))
    a_gen = step_auc(generated, prm_scores(prm, tok, generated))
    out = {
        "eval_problems": n,
        "greedy_accuracy": sum(map(is_correct, ps, greedy)) / n,
        "sampled_accuracy_t0.8": sum(map(is_correct, ps, sampled)) / n,
        "prm_auc_planted": a_planted.overall, "prm_auc_planted_first_wrong": a_planted.first_wrong,
        "prm_auc_generated": a_gen.overall, "prm_auc_generated_first_wrong": a_gen.first_wrong,
        "generated_first_wrong_steps": a_gen.n_first_wrong, "generated_right_steps": a_gen.n_right,
        "eval_seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    for k, v in out.items():
        logger.info("%s: %s", k, f"{v:.4f}" if isinstance(v, float) else v)
    return out


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = train(parse_args(argv))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
