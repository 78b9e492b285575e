"""Real-model backend: Qwen2 / Llama generators and PRMs over a paged KV cache.

Import-light on purpose: names are resolved lazily, so ``import
specscale.engine.torch`` does not pull in transformers or build anything.
"""

from importlib import import_module

_EXPORTS = {
    "AttentionBackend": "attention",
    "TorchAttentionBackend": "attention",
    "make_attention_backend": "attention",
    "AttentionBatch": "attention_batch",
    "BatchRow": "attention_batch",
    "ModelConfig": "config",
    "load_model_config": "config",
    "PagedKVCache": "kv_cache",
    "load_model": "loader",
    "ModelRunner": "model_runner",
    "ProcessRewardModel": "prm",
    "PRMInput": "prm_format",
    "QwenMathPRMFormat": "prm_format",
    "RLHFlowPRMFormat": "prm_format",
    "load_tokenizer": "tokenizer",
    "render_chat": "tokenizer",
    "ensure_tiny_models": "tiny_models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
