"""config.json parsing: architecture choice, bias flags, RoPE layouts of transformers 4.x and 5.x."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.model_config import ModelConfig, RopeScaling, load_model_config
from specscale.engine.torch.model.rotary import RotaryEmbedding

BASE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            max_position_embeddings=128)  # fmt: skip


def test_tiny_configs(tiny):
    q = load_model_config(tiny["qwen2"])
    assert (q.architecture, q.kind, q.qkv_bias, q.o_bias, q.tie_word_embeddings) == (
        "Qwen2ForCausalLM", "causal_lm", True, False, True)  # fmt: skip
    assert q.rope_scaling is None and q.head_dim == 16 and q.num_key_value_heads == 2
    ll = load_model_config(tiny["llama"])
    assert (ll.architecture, ll.qkv_bias, ll.tie_word_embeddings) == ("LlamaForCausalLM", False, False)
    assert ll.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 256)
    prm = load_model_config(tiny["qwen2_prm"])
    assert prm.kind == "qwen_math_prm" and prm.torch_dtype == torch.bfloat16


def test_rope_parameters_layout_of_transformers_5():
    legacy = ModelConfig.from_dict({**BASE, "model_type": "llama", "rope_theta": 5e5,
        "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}})  # fmt: skip
    new = ModelConfig.from_dict({**BASE, "model_type": "llama",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})  # fmt: skip
    assert legacy.architecture == new.architecture == "LlamaForCausalLM"  # from model_type alone
    assert (legacy.rope_theta, legacy.rope_scaling) == (new.rope_theta, new.rope_scaling)
    plain = ModelConfig.from_dict({**BASE, "model_type": "qwen2", "rope_parameters": {"rope_type": "default",
                                   "rope_theta": 1e6}})  # fmt: skip
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_llama3_scaling_touches_all_three_bands(tiny):
    """Tiny llama config is chosen so that high, medium and low frequency bands all occur."""
    cfg = load_model_config(tiny["llama"])
    scaled = RotaryEmbedding(cfg).inv_freq
    plain = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    ratio = (plain / scaled).tolist()
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(8.0)
    assert any(1.01 < r < 7.99 for r in ratio)


def test_rotary_matches_transformers(tiny, hf_causal_lm):
    for name in ("qwen2", "llama"):
        ours = RotaryEmbedding(load_model_config(tiny[name])).inv_freq
        theirs = hf_causal_lm(name, torch.float32).model.rotary_emb.inv_freq
        assert torch.equal(ours, theirs.float())


def test_missing_field_is_named():
    raw = dict(BASE, model_type="qwen2")
    raw.pop("intermediate_size")
    with pytest.raises(ValueError, match="missing required field 'intermediate_size'"):
        ModelConfig.from_dict(raw)


def test_sliding_window_refused():
    with pytest.raises(ValueError, match="sliding-window"):
        ModelConfig.from_dict({**BASE, "model_type": "qwen2", "use_sliding_window": True})
