"""Which attention backend a model serves with (``engine.attention``): the choice, kept
apart from the backends so that each backend module only imports what it builds on."""
from __future__ import annotations

import torch

from specscale.engine.torch.attention import cpu_paged_decode as cpu_paged_decode_kernel
from specscale.engine.torch.attention.backends import AttentionBackend, TorchAttentionBackend
from specscale.settings.search_policy import ConfigError


def make_attention_backend(name: str = "torch", device=None, config=None, dtype=None) -> AttentionBackend:
    """"torch" (the portable reference: pure torch, keys gathered), "cpu_kernel" (torch with
    CPU decode rows reading the paged cache in place: ``cpu_paged_decode``, float32/64; an
    error where its kernel cannot be built), "flashinfer", or "auto": FlashInfer on CUDA when
    importable and the dtype is half precision, else torch. "auto" never picks the C kernel:
    a run's numerics must not depend on whether the machine has a compiler.
    FlashInfer is imported only when chosen or probed on CUDA, so CPU machines never touch it."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if name == "auto":
        if dev.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
            return TorchAttentionBackend()
        from specscale.engine.torch.attention.flashinfer import flashinfer_available

        name = "flashinfer" if flashinfer_available() else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu_kernel":
        return _cpu_kernel_backend(dev, dtype)
    if name == "flashinfer":
        if dev.type != "cuda":
            # (message kept matching the pre-FlashInfer wording tests check)
            raise ValueError(f"unknown attention backend 'flashinfer' for device {dev.type}: FlashInfer runs on CUDA only")
        if config is None or dtype is None:
            raise ValueError("the flashinfer attention backend needs the model config and the dtype")
        from specscale.engine.torch.attention.flashinfer import FlashInferAttentionBackend

        return FlashInferAttentionBackend.for_config(config, dtype, dev)
    raise ValueError(f"unknown attention backend {name!r} (available: 'torch', 'cpu_kernel', 'flashinfer', 'auto')")


def _cpu_kernel_backend(dev: torch.device, dtype) -> TorchAttentionBackend:
    """engine.attention=cpu_kernel: the kernel or an error naming the setting and the way out
    (a ConfigError, passed on as is by the builder), never the gathered path in its place."""
    fix = "set engine.attention=torch (the portable path: keys gathered, SDPA)"
    if dev.type != "cpu":
        raise ConfigError(f"engine.attention=cpu_kernel runs on the CPU only, not on {dev.type}; {fix} or auto")
    if dtype is not None and not cpu_paged_decode_kernel.takes(dtype):
        raise ConfigError(f"engine.attention=cpu_kernel takes float32 or float64 models, not {dtype}; {fix}")
    try:
        return TorchAttentionBackend(cpu_paged_decode=True)
    except cpu_paged_decode_kernel.KernelUnavailable as exc:
        raise ConfigError(f"engine.attention=cpu_kernel: {exc}. Either {fix}, or install a C compiler (cc, gcc "
                          f"or clang on PATH, or $CC)") from exc
