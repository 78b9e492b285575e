"""Model configuration read from a checkpoint's ``config.json``.

Only the fields the engine needs are kept, already normalised across the
transformers 4.x layout (``rope_theta`` + ``rope_scaling``) and the 5.x layout
(``rope_parameters``), so the model code never looks at raw JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Architecture name (config.json "architectures"[0]) -> what the checkpoint holds.
SUPPORTED_ARCHITECTURES = {
    "Qwen2ForCausalLM": "causal_lm",
    "Qwen2ForProcessRewardModel": "qwen_math_prm",
    "LlamaForCausalLM": "causal_lm",
}
# model_type -> default architecture when "architectures" is absent.
DEFAULT_ARCHITECTURE = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """Accept a torch dtype or its name ("bfloat16", "torch.float32")."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: always on; Llama: config "attention_bias"
    o_bias: bool  # Llama "attention_bias" also covers o_proj; Qwen2 never has it
    mlp_bias: bool
    torch_dtype: torch.dtype | None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """"causal_lm" or "qwen_math_prm"."""
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        arch = _resolve_architecture(raw, source)
        model_type = raw.get("model_type") or ("qwen2" if arch.startswith("Qwen2") else "llama")
        if model_type not in DEFAULT_ARCHITECTURE:
            raise ValueError(f"{source}: unsupported model_type {model_type!r}")
        if raw.get("use_sliding_window"):
            raise ValueError(f"{source}: sliding-window attention (use_sliding_window=true) is not supported")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: unsupported hidden_act {act!r} (only 'silu')")
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            is_llama = model_type == "llama"
            attention_bias = bool(raw.get("attention_bias", False))
            theta, scaling = _parse_rope(raw, source)
            return cls(
                architecture=arch,
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                max_position_embeddings=int(raw["max_position_embeddings"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=attention_bias if is_llama else True,
                o_bias=attention_bias if is_llama else False,
                mlp_bias=bool(raw.get("mlp_bias", False)) if is_llama else False,
                torch_dtype=parse_dtype(raw.get("torch_dtype") or raw.get("dtype")),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=raw.get("eos_token_id"),
                raw=raw,
            )
        except KeyError as e:
            raise ValueError(f"{source}: missing required field {e.args[0]!r}") from None


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate ``<model_dir>/config.json``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {model_dir}")
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {model_dir}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return ModelConfig.from_dict(raw, source=str(path))


def _resolve_architecture(raw: dict[str, Any], source: str) -> str:
    archs = raw.get("architectures") or []
    if archs:
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{source}: unknown architecture {arch!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        return arch
    model_type = raw.get("model_type")
    if model_type not in DEFAULT_ARCHITECTURE:
        raise ValueError(
            f"{source}: no 'architectures' and unknown model_type {model_type!r}; "
            f"supported model types: {sorted(DEFAULT_ARCHITECTURE)}"
        )
    return DEFAULT_ARCHITECTURE[model_type]


def _parse_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    # transformers 5 writes "rope_parameters" (holding rope_theta); 4.x writes
    # "rope_theta" + "rope_scaling" (type under "rope_type" or the older "type").
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"{source}: unsupported rope scaling type {rope_type!r} (supported: default, llama3)")
    try:
        return theta, RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(
                raw.get("original_max_position_embeddings")
                or params.get("original_max_position_embeddings")
                or raw["max_position_embeddings"]
            ),
        )
    except KeyError as e:
        raise ValueError(f"{source}: llama3 rope scaling lacks {e.args[0]!r}") from None
