"""Build a model from a local Hugging Face checkpoint directory.

``config.json`` picks the class (by ``architectures`` / ``model_type``); weights
come from ``model.safetensors`` or a sharded ``model.safetensors.index.json``.
The module is built on the meta device and materialised directly in the target
dtype and device, so an 8B model never exists in float32 on the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn

from specscale.engine.torch.model_config import ModelConfig, load_model_config, parse_dtype
from specscale.engine.torch.model.llama import LlamaForCausalLM
from specscale.engine.torch.model.qwen2 import Qwen2ForCausalLM, Qwen2ForProcessRewardModel

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2ForProcessRewardModel": Qwen2ForProcessRewardModel,
    "LlamaForCausalLM": LlamaForCausalLM,
}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# Buffers some older exports saved; we recompute them.
_ALWAYS_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint, single-file or sharded."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {model_dir}")
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"corrupt safetensors index {index}: {e!r}") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"shard {f.name} listed in {index} is missing")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory {model_dir}")


def iter_checkpoint_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, on CPU, in file dtype."""
    for path in checkpoint_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except Exception as e:  # safetensors raises its own error type; name the file instead
            raise ValueError(f"corrupt or unreadable safetensors file {path}: {e}") from e


def random_model(
    config: ModelConfig,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    std: float = 0.02,
) -> nn.Module:
    """The config's architecture with random weights (``model.load_format=random``).

    Built on the meta device and filled in place on ``device`` in the target dtype (an
    8B model never exists on the host). Matrices and biases ~ N(0, std), norms = 1: the
    activations keep a trained model's scale, so kernels see realistic values.
    """
    dtype = parse_dtype(dtype) or config.torch_dtype or torch.float32
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported model dtype {dtype}; supported: {SUPPORTED_DTYPES}")
    cls = MODEL_CLASSES[config.architecture]
    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name.rsplit(".", 2)[-2]:
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=gen)
    return _finish(model)


def _finish(model: nn.Module) -> nn.Module:
    model.eval()
    model.requires_grad_(False)
    for module in model.modules():  # fewer, larger matmuls per layer (weights stay under their names)
        if hasattr(module, "fuse_projections"):
            module.fuse_projections()
    return model


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str = "cpu",
    config: ModelConfig | None = None,
) -> nn.Module:
    """Instantiate the config's architecture and load its weights.

    dtype: None -> the config's ``torch_dtype``, else float32.
    """
    config = config or load_model_config(model_dir)
    dtype = parse_dtype(dtype) or config.torch_dtype or torch.float32
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported model dtype {dtype}; supported: {SUPPORTED_DTYPES}")
    cls = MODEL_CLASSES[config.architecture]
    files = checkpoint_files(model_dir)  # fail on missing weights before allocating anything

    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype).to_empty(device=device)

    params = dict(model.named_parameters())
    ignored = cls.ignored_checkpoint_keys(config)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in iter_checkpoint_tensors(model_dir):
        if name in ignored or name.endswith(_ALWAYS_IGNORED_SUFFIXES):
            continue
        param = params.get(name)
        if param is None:
            unexpected.append(name)
            continue
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"weight {name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)} "
                f"(config.json does not match the weights in {files[0].parent})"
            )
        with torch.no_grad():
            param.copy_(tensor.to(dtype))
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {Path(model_dir)} does not match {config.architecture}: "
            f"missing weights {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected weights {sorted(unexpected)[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    return _finish(model)
