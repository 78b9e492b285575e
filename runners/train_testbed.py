"""Train the CPU testbed (tokenizer, generator, PRM) and write the shipped checkpoints.

    python -m runners.train_testbed                  # model=testbed's shipped weights (seed 0)
    python -m runners.train_testbed --pair levels    # model=testbed_levels's shipped weights (25 min)
    python -m runners.train_testbed --out /tmp/tb    # somewhere else
    python -m runners.train_testbed --gen-steps 2 --prm-steps 3 --no-eval --out /tmp/x  # a smoke run
    python -m runners.train_testbed --levels 1,2,3,4,5 --out /tmp/tb_levels  # difficulty levels (dataset=arith_levels)

``--pair levels`` is the recipe of the shipped levels pair (``PAIRS``; flags given beside it
win) written to ``specscale/testbed/weights/levels``.

``--levels``: train on a mix of the difficulty levels of ``specscale.data.arith.LEVELS``
(instead of the single shipped task) and evaluate on the levels test split, per level,
and on the held-out hard split (``arith_hard.jsonl``, never trained on). Training streams
exclude the questions of both splits and of the shipped split.

The generator is a Qwen2 LM trained on reference solutions (``--gen-steps``, its own cosine
schedule). The PRM starts from it, optionally after ``--body-steps`` more LM steps (a
verifier that computes better than the generator it checks), with ``--prm-extra-layers``
new decoder layers on top (see ``specscale.testbed.models.prm_from_generator``), and
learns to check steps from planted errors (``specscale/testbed/prm_data.py``) while an LM
loss keeps it computing.

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
import sys
import time
from pathlib import Path

import torch

from specscale.data.arith import (HARD_FILE, LEVELS_TEST_FILE, ArithSpec, LevelMix, held_out_problems,
                                  held_out_questions, levels_held_out_questions, problems, read_split)  # fmt: skip
from specscale.testbed import WEIGHTS_DIR, models
from specscale.testbed.checkpoint import save_generator, save_prm
from specscale.testbed.tokenizer import testbed_tokenizer
from specscale.testbed.train import Schedule, train_generator, train_prm

logger = logging.getLogger("train_testbed")
EVAL_SEED = 99  # held-out planted paths: problems of the test split, errors drawn with this seed


# Recipes of shipped pairs other than the default (model=testbed_levels: conf/model/testbed_levels.yaml).
# The levels PRM needed a body trained past the generator and one decoder layer more to reach
# a first-error AUC of 0.9 on the generator's own steps (its training.json reports 0.924).
PAIRS = {"levels": ["--levels", "1,2,3,4,5", "--gen-steps", "1100", "--body-steps", "1600", "--prm-extra-layers", "1",
                    "--prm-steps", "1100", "--gen-samples", "8000", "--out", str(WEIGHTS_DIR / "levels")]}


def parse_args(argv=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pair", choices=sorted(PAIRS))
    known, rest = pre.parse_known_args(argv)
    argv = ([*PAIRS[known.pair], *rest]) if known.pair else argv  # the recipe first: explicit flags win
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=sorted(PAIRS), help="train a shipped pair's recipe (see PAIRS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen-steps", type=int, default=800)
    ap.add_argument("--generator-from", type=Path, default=None,
                    help="a generator checkpoint to start from instead of training one (retrain only the PRM)")
    ap.add_argument("--body-steps", type=int, default=0, help="more LM steps before the PRM starts from the generator")
    ap.add_argument("--gen-snapshot", type=int, default=None,
                    help="the generator is the snapshot after this many of the --gen-steps LM steps; the PRM's body "
                         "is the fully trained model (before any --body-steps)")
    ap.add_argument("--levels", type=str, default=None,
                    help="comma-separated difficulty levels to train on (e.g. 1,2,3,4,5); default: the shipped task")
    ap.add_argument("--level-weights", type=str, default=None, help="comma-separated sampling weights of --levels")
    ap.add_argument("--prm-extra-layers", type=int, default=0)
    ap.add_argument("--prm-steps", type=int, default=600)
    ap.add_argument("--gen-samples", type=int, default=4000,
                    help="generator solutions (T=0.8, training problems) labelled for the PRM; 0 = planted errors only")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--gen-lr", type=float, default=3e-3)
    ap.add_argument("--prm-lr", type=float, default=2e-3)
    ap.add_argument("--lm-weight", type=float, default=1.0, help="auxiliary LM loss weight of the PRM")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=200,
                    help="problems of the shipped test split to evaluate on; with --levels, at most this many of "
                         "each level of the levels test split and of the hard split")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = ap.parse_args(argv)
    args.pair = known.pair
    return args


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    if args.levels:
        spec, exclude = level_mix(args.levels, args.level_weights), levels_held_out_questions()
    else:
        spec, exclude = ArithSpec(), held_out_questions()
    tok = testbed_tokenizer(args.seed)
    trained_body = None
    if args.generator_from is not None:
        gen, gen_log = _load_generator(args.generator_from, tok), None
    else:
        gen = models.generator(tok, args.seed)
        gen_log, snapshot = train_generator(gen, tok, Schedule(args.gen_steps, args.batch, args.gen_lr), args.seed + 1,
                                            spec, exclude, snapshot_at=args.gen_snapshot)  # fmt: skip
        if snapshot is not None:
            trained_body, gen = gen, models.generator(tok, args.seed)
            gen.load_state_dict(snapshot)
            gen.eval()
    body, body_seconds = (trained_body if trained_body is not None else gen), 0.0
    if args.body_steps:
        body = models.generator(tok, args.seed)
        body.load_state_dict((trained_body if trained_body is not None else gen).state_dict())
        body_log, _ = train_generator(body, tok, Schedule(args.body_steps, args.batch, args.gen_lr / 3), args.seed + 4,
                                      spec, exclude)  # fmt: skip
        body_seconds = body_log.seconds
    t0 = time.perf_counter()
    sampled = labelled_samples(gen, tok, args.gen_samples, args.seed + 5, spec, exclude)
    sample_seconds = time.perf_counter() - t0
    prm = models.prm_from_generator(body, args.seed + 2, extra_layers=args.prm_extra_layers)
    prm_log = train_prm(prm, tok, Schedule(args.prm_steps, args.batch, args.prm_lr), args.seed + 3, spec, exclude,
                        lm_weight=args.lm_weight, sampled=sampled)  # fmt: skip
    report = {
        "seed": args.seed, "threads": args.threads, "gen_steps": args.gen_steps, "body_steps": args.body_steps,
        **({"levels": list(spec.levels), "level_weights": spec.weights, "gen_snapshot": args.gen_snapshot}
           if args.levels else {}),
        "prm_extra_layers": args.prm_extra_layers, "prm_steps": args.prm_steps,
        "batch": args.batch, "gen_lr": args.gen_lr, "prm_lr": args.prm_lr, "lm_weight": args.lm_weight,
        "generator_from": str(args.generator_from) if args.generator_from else None,
        "generator_seconds": round(gen_log.seconds, 1) if gen_log else None, "body_seconds": round(body_seconds, 1),
        "gen_samples": args.gen_samples, "sample_seconds": round(sample_seconds, 1),
        "sampled_wrong_paths": sum(p.first_error is not None for p in sampled),
        "prm_seconds": round(prm_log.seconds, 1), "generator_final_loss": gen_log.losses[-1] if gen_log else None,
        "prm_final_loss": prm_log.losses[-1],
        "generator_parameters": sum(p.numel() for p in gen.parameters()),
        "prm_parameters": sum(p.numel() for p in prm.checkpoint_state().values()),
    }  # fmt: skip
    if not args.no_eval and args.levels:
        report.update(evaluate_levels(gen, prm, tok, args.seed, args.eval_problems))
    elif not args.no_eval:
        report.update(evaluate(gen, prm, tok, args.eval_problems, args.seed))
    save_generator(gen, tok, args.out / "generator")
    save_prm(prm, tok, args.out / "prm")
    report["total_seconds"] = round(time.perf_counter() - t_start, 1)
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def level_mix(levels: str, weights: str | None) -> LevelMix:
    lv = tuple(int(x) for x in levels.split(","))
    return LevelMix(lv, tuple(float(x) for x in weights.split(",")) if weights else None)


def labelled_samples(gen, tok, n: int, seed: int, spec, exclude) -> list:
    """``n`` generator solutions of training problems at T = 0.8 (the search's temperature),
    each step labelled by checking it against the reference solution."""
    from specscale.testbed.evaluate import label_steps, sample

    if n <= 0:
        return []
    stream = problems(seed, spec, exclude)
    ps = [next(stream) for _ in range(n)]
    texts = sample(gen, tok, [p.question for p in ps], temperature=0.8, seed=seed, max_new_tokens=_max_new(ps))
    return [path for path in (label_steps(p, t) for p, t in zip(ps, texts)) if path.steps]


def _load_generator(path: Path, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if AutoTokenizer.from_pretrained(str(path)).get_vocab() != tok.get_vocab():
        raise SystemExit(f"--generator-from {path}: its tokenizer differs from the one this seed builds")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _split_metrics(gen, prm, tok, ps, seed: int, planted: bool = True) -> tuple[dict, dict]:
    """On problems ``ps``: the generator's accuracy (greedy and T = 0.8) and the PRM's step
    AUCs on the generator's own samples (and on planted errors); plus what a per-level
    breakdown reads (per-problem correctness, the kept sampled paths and their scores)."""
    from specscale.testbed.evaluate import is_correct, label_steps, planted_paths, prm_scores, sample, step_auc

    qs = [p.question for p in ps]
    greedy = sample(gen, tok, qs, temperature=0.0, seed=seed, max_new_tokens=_max_new(ps))
    sampled = sample(gen, tok, qs, temperature=0.8, seed=seed, max_new_tokens=_max_new(ps))
    g_ok, s_ok = list(map(is_correct, ps, greedy)), list(map(is_correct, ps, sampled))
    generated = [label_steps(p, t) for p, t in zip(ps, sampled)]
    kept = [i for i, g in enumerate(generated) if g.steps]
    paths = [generated[i] for i in kept]
    scores = prm_scores(prm, tok, paths)
    a_gen = step_auc(paths, scores)
    out = {
        "eval_problems": len(ps),
        "greedy_accuracy": sum(g_ok) / len(ps), "sampled_accuracy_t0.8": sum(s_ok) / len(ps),
        "prm_auc_generated": a_gen.overall, "prm_auc_generated_first_wrong": a_gen.first_wrong,
        "generated_first_wrong_steps": a_gen.n_first_wrong, "generated_right_steps": a_gen.n_right,
    }  # fmt: skip
    if planted:
        pl = planted_paths(ps, EVAL_SEED)
        a_planted = step_auc(pl, prm_scores(prm, tok, pl))
        out.update({"prm_auc_planted": a_planted.overall, "prm_auc_planted_first_wrong": a_planted.first_wrong})
    return out, {"greedy_ok": g_ok, "sampled_ok": s_ok, "kept": kept, "paths": paths, "scores": scores}


def _logged(out: dict, t0: float) -> dict:
    out["eval_seconds"] = round(time.perf_counter() - t0, 1)
    for k, v in out.items():
        logger.info("%s: %s", k, f"{v:.4f}" if isinstance(v, float) else v)
    return out


def evaluate(gen, prm, tok, n: int, seed: int) -> dict:
    """``_split_metrics`` on the first ``n`` problems of the shipped test split."""
    t0 = time.perf_counter()
    return _logged(_split_metrics(gen, prm, tok, held_out_problems(n), seed)[0], t0)


def _max_new(ps) -> int:
    """64 new tokens for problems of up to 4 operations (the shipped task's budget); room
    for the longest reference solution plus slack for longer ones."""
    longest = max(len(p.ops) for p in ps)
    return 64 if longest <= 4 else 16 * (longest + 2)


def evaluate_levels(gen, prm, tok, seed: int, cap: int) -> dict:
    """``_split_metrics`` on the levels test split (overall and per level: at most ``cap``
    problems of each) and on the hard split (at most ``cap``; keys prefixed ``hard_``)."""
    from specscale.testbed.evaluate import step_auc

    t0 = time.perf_counter()
    by_level: dict[int, list] = {}
    for level, p in read_split(LEVELS_TEST_FILE):
        if len(by_level.setdefault(level, [])) < cap:
            by_level[level].append(p)
    rows = [(level, p) for level, ps in sorted(by_level.items()) for p in ps]
    out, d = _split_metrics(gen, prm, tok, [p for _, p in rows], seed)
    row_of_path = {i: k for k, i in enumerate(d["kept"])}
    per_level = {}
    for level in sorted(by_level):
        idx = [i for i, (lv, _) in enumerate(rows) if lv == level]
        k = [row_of_path[i] for i in idx if i in row_of_path]
        per_level[str(level)] = {
            "problems": len(idx), "greedy_accuracy": sum(d["greedy_ok"][i] for i in idx) / len(idx),
            "sampled_accuracy_t0.8": sum(d["sampled_ok"][i] for i in idx) / len(idx),
            "prm_auc_generated_first_wrong": step_auc([d["paths"][j] for j in k],
                                                      [d["scores"][j] for j in k]).first_wrong,
        }  # fmt: skip
    out["per_level"] = per_level
    hard = [p for _, p in read_split(HARD_FILE)][:cap]
    out.update({f"hard_{k}": v for k, v in _split_metrics(gen, prm, tok, hard, seed, planted=False)[0].items()})
    return _logged(out, t0)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = train(parse_args(argv))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
