"""The same tiny pair and workload on engine=torch and engine=vllm, with the sim's prediction.

    python -m runners.bench_engines [--policies nonspec,spec,ep,ep_cd,full] [--beam 4]
        [--n-problems 4] [--concurrency 4] [--max-rounds 6] [--identity-problems 24]
        [--decode 64x32x64,256x512x64] [--repeat 1] [--set KEY=VALUE ...] [--json OUT]

One printed table, three parts:

1. Policies. Each policy on ``model=tiny_vllm`` (Qwen2 generator + Qwen2.5-Math-PRM format,
   head_dim 64, float32, random weights) on the same problems and seed, on engine=torch,
   engine=vllm and engine=sim: ``output_tok_s``, makespan, computed prefill tokens
   (generator tokens run as prefill: prompts, recomputation after preemption, the last
   token of a re-found prefix), PRM tokens computed, and each engine's ratios to its own
   nonspec (output_tok_s, and makespan nonspec/policy). The sim's numbers are modelled
   (its cost model for ``hardware``, default a100, on its synthetic workload with the
   pair's dimensions): a prediction of the ratios, not of CPU seconds. engine=torch
   runs with its PRM prefix cache on (its default) and off (``torch_prm_off``: whole
   paths, as vLLM's step-tag pooling must compute them, engine_features).
2. Tree identity on vLLM: the share of problems (>= 20) whose search tree under each
   equivalent policy (spec, ep_strict, ep_cd strict) is identical to nonspec's, seeded
   sampling (temperature 1.0), over the bundled fixture problems (MATH-500, GSM8K and
   OlympiadBench formats: up to 36).
3. Raw decode: S sequences x P-token random prompts x N new tokens, exact length
   (no stop tokens), temperature 0.8, one torch thread: our engine (GenerationEngine +
   TorchBackend) vs vLLM's LLMEngine, wall clock with prefill, best of --repeat after a
   warm-up.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from runners.bench_torch_engine import TEMPERATURE, decode_vllm, random_prompts, run_ours
from specscale.cell import build_server
from specscale.compose import compose_config
from specscale.metrics.summary import summarize

# torch_prm_off: engine=torch with its PRM prefix cache off, i.e. whole-path PRM inputs as on vLLM.
ENGINES = ("torch", "torch_prm_off", "vllm", "sim")
SHOWN = ("output_tok_s", "makespan_s", "prefill_tokens", "prm_tokens", "output_tokens")


def run_policy(engine: str, policy: str, base: list[str], vllm_set: tuple[str, ...] = ()) -> dict:
    extra = {"torch": ["engine.dtype=float32"], "torch_prm_off": ["engine.dtype=float32", "engine.prm_prefix_cache=false"],
             "vllm": list(vllm_set), "sim": []}[engine]
    strict = ["policy.pruning=strict"] if policy in ("ep_cd_strict", "full_strict") else []
    cfg = compose_config([*base, f"engine={engine.split('_')[0]}",
                          f"policy={policy.replace('_strict', '') if strict else policy}", *strict, *extra], resolve=True)
    server = build_server(cfg)
    rec = server.run()
    bs = server.blocks.block_size
    s = summarize(rec, cfg["metrics"]["latency_budgets_s"], server.backend.bytes_per_block(bs))
    s["prefill_tokens"] = int(sum(r["prefill_tokens"] for r in rec.iterations))
    s["rounds_frame"] = rec.rounds
    return s


IDENTITY_DATASETS = ("fixture_math500", "fixture_gsm8k", "fixture_olympiadbench")  # 12 + 14 + 12 problems


def identity_share(base: list[str], n_problems: int, vllm_set: tuple[str, ...] = ()) -> tuple[dict[str, float], int]:
    """Share of problems whose tree (members, texts, scores, selections) equals nonspec's,
    over the first n_problems of the bundled fixtures (each holds 12-14); and how many."""
    base = [b for b in base if not b.startswith(("n_problems=", "search.temperature=", "dataset="))]
    base += ["search.temperature=1.0"]
    plan, left = [], n_problems
    for name in IDENTITY_DATASETS:
        if left > 0:
            plan.append((name, min(left, 12)))
            left -= 12
    if left > 0:
        raise ValueError(f"--identity-problems {n_problems}: the bundled fixtures hold {12 * len(IDENTITY_DATASETS)}")

    def trees(policy):
        out: dict[tuple, list] = {}
        for dataset, n in plan:
            rounds = run_policy("vllm", policy, [*base, f"dataset={dataset}", f"n_problems={n}"], vllm_set)["rounds_frame"]
            for r in sorted(rounds, key=lambda r: (r["request_id"], r["round"])):
                out.setdefault((dataset, r["request_id"]), []).append(
                    (tuple(r["member_keys"]), tuple(map(tuple, r["member_texts"])), tuple(r["member_scores"]),
                     tuple(r["selected_keys"])))
        return out

    ref = trees("nonspec")
    shares = {}
    for policy in ("spec", "ep_strict", "ep_cd_strict"):
        got = trees(policy)
        shares[policy] = sum(got.get(k) == v for k, v in ref.items()) / len(ref)
    return shares, len(ref)


# ---------------------------------------------------------------- raw decode


def decode_torch(seqs: int, prompt: int, new: int, repeat: int) -> float:
    from specscale.engine.torch.backend import TorchBackend
    from specscale.engine.torch.runtime.model_runner import ModelRunner
    from specscale.engine.torch.prm.model import ProcessRewardModel
    from specscale.testbed.tiny_models import ensure_tiny_models
    from specscale.engine.text.tokenizer import load_tokenizer

    paths = ensure_tiny_models()
    runner = ModelRunner(paths["qwen2_h64"], num_blocks=seqs * (-(-(prompt + new) // 16) + 1), block_size=16,
                         dtype=torch.float32)
    prm = ProcessRewardModel(paths["qwen2_prm_h64"], dtype=torch.float32)
    backend = TorchBackend(runner, prm, load_tokenizer(paths["qwen2_h64"]), {})
    prompts = random_prompts(seqs, prompt, backend.vocab_size)
    run_ours(backend, prompts, new)  # warm-up
    return min(run_ours(backend, prompts, new)[0] for _ in range(repeat))


# ---------------------------------------------------------------- main


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="nonspec,spec,ep,ep_cd,full")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--n-problems", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-rounds", type=int, default=6)
    ap.add_argument("--identity-problems", type=int, default=24)
    ap.add_argument("--decode", default="64x32x64,256x512x64", help="SEQSxPROMPTxNEW,... ('' to skip)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--vllm-set", action="append", default=[], help="extra override for engine=vllm cells only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    base = ["model=tiny_vllm", f"beam={args.beam}", "expansion=2" if args.beam % 2 == 0 else "expansion=1",
            f"concurrency={args.concurrency}", f"n_problems={args.n_problems}", f"search.max_rounds={args.max_rounds}",
            "search.step_token_cap=24", "search.path_token_cap=96", "search.temperature=1.0", "seed=0",
            "progress=false", "wandb.mode=disabled", *args.set]
    out: dict = {"policies": [], "identity": {}, "decode": []}
    policies = args.policies.split(",")
    print(f"tiny_vllm pair, float32, beam {args.beam}, {args.n_problems} problems, concurrency {args.concurrency}, "
          f"one torch thread; sim = modelled ({base[0]}, hardware a100)")
    print(f"{'engine':<13} {'policy':<8} {'out tok/s':>10} {'makespan s':>10} {'prefill tok':>11} {'PRM tok':>8} "
          f"{'out tok/s / nonspec':>19} {'makespan nonspec/pol':>20}")
    for engine in ENGINES:
        ref = None
        for policy in policies:
            s = run_policy(engine, policy, base, tuple(args.vllm_set))
            row = {"engine": engine, "policy": policy, **{k: s[k] for k in SHOWN}}
            ref = ref or row
            row["ratio_output_tok_s"] = row["output_tok_s"] / ref["output_tok_s"]
            row["makespan_ratio"] = ref["makespan_s"] / row["makespan_s"]
            out["policies"].append(row)
            print(f"{engine:<13} {policy:<8} {row['output_tok_s']:>10.1f} {row['makespan_s']:>10.3f} "
                  f"{row['prefill_tokens']:>11} {row['prm_tokens']:>8} {row['ratio_output_tok_s']:>19.2f} "
                  f"{row['makespan_ratio']:>20.2f}")
    if args.identity_problems:
        out["identity"], n = identity_share(base, args.identity_problems, tuple(args.vllm_set))
        out["identity_problems"] = n
        shares = ", ".join(f"{p} {v:.0%}" for p, v in out["identity"].items())
        print(f"vllm, seeded (temperature 1.0), {n} problems ({', '.join(IDENTITY_DATASETS)}): trees identical "
              f"to nonspec: {shares}")
    if args.decode:
        from specscale.engine.vllm.build import _ENGINES

        (engines,) = _ENGINES.values()  # the pair the vllm cells above used
        print(f"raw decode, exact length, temperature {TEMPERATURE}, best of {args.repeat}:")
        print(f"{'seqs x prompt x new':<20} {'torch tok/s':>11} {'vllm tok/s':>11} {'vllm/torch':>10}")
        for spec in args.decode.split(","):
            seqs, prompt, new = map(int, spec.split("x"))
            t = decode_torch(seqs, prompt, new, args.repeat)
            v = decode_vllm(engines.gen, seqs, prompt, new, args.repeat)
            tokens = seqs * new
            out["decode"].append({"shape": spec, "torch_tok_s": tokens / t, "vllm_tok_s": tokens / v})
            print(f"{spec:<20} {tokens / t:>11.0f} {tokens / v:>11.0f} {t / v:>10.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
