"""Build FlashInfer's JIT kernels once, before they are timed (CUDA + flashinfer-python).

    python -m runners.flashinfer_warmup [--model qwen2.5-7b] [--dtype bfloat16]

flashinfer-python compiles each kernel family with nvcc the first time it is planned
(minutes on Hopper for the FA3 prefill kernels) and caches it under
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``. This runs the attention backend's three
paths once — a paged decode batch (also what CUDA-graph decode uses), a cached prefill
batch and a no-cache (ragged) batch — at the head geometry of both models of a pair, so a
benchmark or sweep that follows finds every kernel built. ``runners/gpu_check.sh`` runs it
in the background while its torch-attention steps use the GPU.

Set ``MAX_JOBS`` (parallel nvcc jobs) and ``FLASHINFER_CUDA_ARCH_LIST`` (e.g. "9.0") to
bound the build; gpu_check.sh does.
"""
from __future__ import annotations

import argparse
import time

import torch
import yaml

from specscale.compose import CONF_DIR
from specscale.engine.torch.model_config import ModelConfig, parse_dtype
from specscale.engine.torch.model.configs import config_for


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-7b", help="conf/model pair (both models' head geometry)")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("flashinfer_warmup: needs a CUDA device")
    from specscale.engine.torch.attention.flashinfer import FlashInferAttentionBackend

    device, dtype = torch.device("cuda"), parse_dtype(args.dtype)
    pair = yaml.safe_load((CONF_DIR / "model" / f"{args.model}.yaml").read_text())
    seen = set()
    for role in ("generator", "prm"):
        cfg = ModelConfig.from_dict(config_for(pair[role]["hf_name"]))
        geometry = (cfg.num_attention_heads == cfg.num_key_value_heads, cfg.head_dim)
        if geometry in seen:  # kernels are built per head size and MHA/GQA, not per head count
            continue
        seen.add(geometry)
        t0 = time.perf_counter()
        times = FlashInferAttentionBackend.for_config(cfg, dtype, device).warm_up()
        print(f"flashinfer {role} ({pair[role]['hf_name']}, heads {cfg.num_attention_heads}/"
              f"{cfg.num_key_value_heads}, head_dim {cfg.head_dim}): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
              + f"; total {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
