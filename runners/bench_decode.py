"""Decode micro-benchmark: time per decode iteration vs batch size, against the HBM roofline.

    python -m runners.bench_decode [--model qwen2.5-7b] [--role generator] [--hardware h200]
                                   [--batch 1,2,4,8,16,32,64,128,256] [--ctx 512] [--iters 10]
                                   [--reduced] [--dtype bfloat16] [--device auto] [--json OUT]

One decode iteration = ``make_batch`` + the paged forward + the LM head for every row
(``ModelRunner``: the engine's serving path), timed device-synchronised, median of
``--iters`` after a warm-up. Every row decodes one token at context ``--ctx`` in its own
KV blocks (the cache content does not change the cost, so no prefill is run). Each batch
size is timed twice, side by side: eager, and replayed from decode graphs (``--graphs``:
CUDA graphs on CUDA; on CPU ``on`` runs the same fixed-shape path without capture).

Roofline (a decode step is memory-bound): bytes = weights streamed per forward (body +
LM head, ``ModelDims``) + K/V of every row's context, over the HBM bandwidth of the
``--hardware`` profile (conf/hardware/*.yaml). Printed: measured ms, roofline ms and the
fraction roofline / measured (1.0 = at the bandwidth peak).

Weights are random (``load_format=random`` from the stored config.json): real size on
CUDA; ``--reduced`` (default on CPU) keeps the architecture at hidden 64, 2 layers, so
the script runs anywhere. On CPU the fraction is against the GPU profile and is only a
smoke test of the script.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

from specscale.engine.sim.hardware import HardwareProfile
from specscale.engine.sim.model_dims import ModelDims
from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.model_config import ModelConfig, parse_dtype
from specscale.engine.torch.model.configs import config_for, reduced
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.resources import conf_dir

CONF = conf_dir()


def model_dims(cfg: ModelConfig) -> ModelDims:
    return ModelDims(
        hf_name="", arch=cfg.model_type, hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size,
        tie_word_embeddings=cfg.tie_word_embeddings, qkv_bias=cfg.qkv_bias, head="lm",
    )


def roofline_seconds(dims: ModelDims, hw: HardwareProfile, batch: int, ctx: int, dtype_bytes: int) -> float:
    weights = dims.body_read_bytes(dtype_bytes) + dims.head_read_bytes(dtype_bytes)
    kv = batch * ctx * dims.kv_bytes_per_token(dtype_bytes)
    return (weights + kv) / hw.hbm_bandwidth_bytes_s


def build_runner(model: str, role: str, reduce: bool, dtype, device, n_blocks: int, attention=None) -> ModelRunner:
    m = yaml.safe_load((CONF / "model" / f"{model}.yaml").read_text())[role]
    raw = config_for(m["hf_name"])
    cfg = ModelConfig.from_dict(reduced(raw) if reduce else raw)
    if cfg.kind != "causal_lm":
        raise SystemExit(f"{model}.{role} is a {cfg.architecture}; decode needs a causal LM (use --role generator)")
    return ModelRunner(None, config=cfg, load_format="random", num_blocks=n_blocks, dtype=dtype, device=device,
                       attention_backend=attention)


def time_decode(runner: ModelRunner, batch: int, ctx: int, iters: int, step=None) -> float:
    """Median seconds of one decode iteration at ``batch`` rows of context ``ctx``."""
    bs = runner.block_size
    per_row = -(-(ctx + 1) // bs)
    rows = [BatchRow([7 + (i % 100)], ctx - 1, list(range(i * per_row, (i + 1) * per_row))) for i in range(batch)]

    def once():
        b = runner.make_batch(rows)
        if step is not None:
            return step(b)
        return runner.compute_logits(runner.forward(b), b)

    once()  # warm-up (allocator, kernels)
    times = []
    for _ in range(iters):
        runner.synchronize()
        t0 = time.perf_counter()
        once()
        runner.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="conf/model name (default qwen2.5-7b on CUDA, tiny on CPU)")
    ap.add_argument("--role", default="generator")
    ap.add_argument("--hardware", default="h200", help="conf/hardware name (the roofline's bandwidth)")
    ap.add_argument("--batch", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reduced", action="store_true", help="hidden 64, 2 layers (default on CPU)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--attention", default="auto", help="auto | torch | flashinfer")
    ap.add_argument("--graphs", default="auto", choices=["auto", "on", "off"],
                    help="also time decode graphs (auto: on with CUDA)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    cuda = device.type == "cuda"
    model = args.model or ("qwen2.5-7b" if cuda else "tiny")
    reduce = args.reduced or not cuda
    dtype = parse_dtype(args.dtype or ("bfloat16" if cuda else "float32"))
    if not cuda:
        torch.set_num_threads(1)
    batches = [int(b) for b in args.batch.split(",")]
    hw = HardwareProfile.from_config(yaml.safe_load((CONF / "hardware" / f"{args.hardware}.yaml").read_text()))
    n_blocks = max(batches) * -(-(args.ctx + 1) // 16)
    from specscale.engine.torch.attention.select import make_attention_backend

    runner = build_runner(model, args.role, reduce, dtype, device, n_blocks)
    runner.backend = make_attention_backend(args.attention, device, runner.config, runner.dtype)
    graphs = None
    if args.graphs == "on" or (args.graphs == "auto" and cuda):
        runner.enable_decode_graphs(max_batch=256, replay="cuda" if cuda else "eager")  # captured on first use
        graphs, runner.graphs = runner.graphs, None
    dims = model_dims(runner.config)
    nbytes = torch.finfo(dtype).bits // 8
    out = {"model": model, "reduced": reduce, "device": str(torch.cuda.get_device_name(device) if cuda else "cpu"),
           "hardware": hw.name, "dtype": str(dtype).removeprefix("torch."), "ctx": args.ctx,
           "attention": runner.backend.name, "graphs": graphs.replay_mode if graphs else None, "rows": []}
    print(f"decode: {model}{' (reduced)' if reduce else ''} {out['dtype']} on {out['device']}, ctx {args.ctx}, "
          f"attention {runner.backend.name}, graphs {out['graphs']}, roofline of {hw.name} "
          f"({hw.hbm_bandwidth_bytes_s / 1e12:.2f} TB/s)")
    print(f"{'batch':>6} {'eager ms':>9} {'graph ms':>9} {'roofline ms':>12} {'frac eager':>11} {'frac graph':>11} "
          f"{'tok/s':>9}")
    for b in batches:
        t_eager = time_decode(runner, b, args.ctx, args.iters)
        t_graph = None
        if graphs is not None and graphs.row_bucket(b) is not None:
            runner.graphs = graphs
            t_graph = time_decode(runner, b, args.ctx, args.iters)  # its warm-up call captures
            runner.graphs = None
        roof = roofline_seconds(dims, hw, b, args.ctx, nbytes)
        best = min(t_eager, t_graph or t_eager)
        row = {"batch": b, "ms_eager": t_eager * 1e3, "ms_graphs": t_graph * 1e3 if t_graph else None,
               "roofline_ms": roof * 1e3, "fraction_eager": roof / t_eager,
               "fraction_graphs": roof / t_graph if t_graph else None,
               "ms": best * 1e3, "fraction": roof / best, "tok_s": b / best}
        out["rows"].append(row)
        g_ms = f"{row['ms_graphs']:>9.3f}" if t_graph else f"{'-':>9}"
        g_fr = f"{row['fraction_graphs']:>11.3f}" if t_graph else f"{'-':>11}"
        print(f"{b:>6} {row['ms_eager']:>9.3f} {g_ms} {row['roofline_ms']:>12.3f} {row['fraction_eager']:>11.3f} "
              f"{g_fr} {row['tok_s']:>9.0f}")
    if graphs is not None:
        out["graph_capture_s"] = graphs.capture_seconds
        print(f"decode graphs: {graphs.num_captured} captured in {graphs.capture_seconds:.2f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
