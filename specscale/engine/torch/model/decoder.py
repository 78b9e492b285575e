"""The decoder-only transformer body shared by Qwen2 and Llama.

Parameter names equal the Hugging Face checkpoint names (``model.layers.3.
self_attn.q_proj.weight`` ...), so loading is a name-for-name copy. Each layer
runs on a flat token batch [T, hidden]; rows are separated only inside the
attention backend, through the plan built from the ``AttentionBatch``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specscale.engine.torch.attention.backends import AttentionBackend
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.hot_ops import EAGER_OPS, HotOps
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.model.layers import GatedMLP, RMSNorm
from specscale.engine.torch.model.rotary import RotaryEmbedding


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=config.o_bias)

        # Fused [q; k; v] (set by fuse_projections). Non-persistent buffers: not in the
        # state dict, but .to() moves them with the parameters.
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One [q; k; v] matrix; q_proj/k_proj/v_proj become views into it, so the
        checkpoint names stay and no memory is duplicated. Call after the weights load."""
        self.qkv_weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        sizes = [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]
        for proj, w in zip((self.q_proj, self.k_proj, self.v_proj), self.qkv_weight.split(sizes)):
            proj.weight = nn.Parameter(w, requires_grad=False)
        if self.q_proj.bias is not None:
            self.qkv_bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            for proj, b in zip((self.q_proj, self.k_proj, self.v_proj), self.qkv_bias.split(sizes)):
                proj.bias = nn.Parameter(b, requires_grad=False)

    def forward(self, x, cos, sin, backend: AttentionBackend, plan: Any, kv_cache,
                ops: HotOps = EAGER_OPS) -> torch.Tensor:
        t = x.shape[0]
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_weight is not None:
            qkv = F.linear(x, self.qkv_weight, self.qkv_bias).view(t, h + 2 * kvh, d)
            qk = ops.rotary(qkv[:, : h + kvh], cos, sin)  # q and k rotate together
            q, k, v = qk[:, :h], qk[:, h:], qkv[:, h + kvh:]
        else:
            q = ops.rotary(self.q_proj(x).view(t, h, d), cos, sin)
            k = ops.rotary(self.k_proj(x).view(t, kvh, d), cos, sin)
            v = self.v_proj(x).view(t, kvh, d)
        o = backend.forward(q, k, v, kv_cache, plan, self.scale)
        return self.o_proj(o.reshape(t, h * d))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = SelfAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, cos, sin, backend, plan, kv_cache, ops: HotOps = EAGER_OPS):
        """x: the previous layer's MLP output (the embeddings at layer 0), not yet added to
        ``residual``, the residual stream so far (None at layer 0). Returns (this layer's MLP
        output, the stream it is still to be added to): each residual add is done by the norm
        that follows it, in one op. The same sums as ``x + attn(norm(x))``, ``+ mlp(norm(..))``
        (additions commute bit for bit, so the eager ops reproduce the old order's results)."""
        if residual is None:
            residual, h = x, self.input_layernorm.norm(x, ops)
        else:
            h, residual = self.input_layernorm.add_norm(x, residual, ops)
        h = self.self_attn(h, cos, sin, backend, plan, kv_cache, ops)
        h, residual = self.post_attention_layernorm.add_norm(h, residual, ops)
        return self.mlp(h, ops), residual


class DecoderModel(nn.Module):
    """Embeddings -> layers -> final norm. Returns hidden states [T, hidden].

    ``hot_ops``: the norm / activation / rotary ops the layers call: ``EAGER_OPS`` (the
    reference) unless ``engine.fused_ops`` installed compiled ones (``fused_ops.py``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.hot_ops: HotOps = EAGER_OPS

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        plan: Any,
        kv_cache: PagedKVCache | None = None,
    ) -> torch.Tensor:
        ops = self.hot_ops
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, backend, plan,
                                kv_cache.layer(i) if kv_cache is not None else None, ops)
        if residual is None:  # no layers
            return self.norm.norm(x, ops)
        return self.norm.add_norm(x, residual, ops)[0]


class CausalLM(nn.Module):
    """Decoder body + LM head (tied to the input embeddings when the config says so)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(self, input_ids, positions, backend, plan, kv_cache=None) -> torch.Tensor:
        return self.model(input_ids, positions, backend, plan, kv_cache)

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], or [N, len(token_ids)] for a vocabulary subset."""
        weight = self.lm_head_weight
        if token_ids is not None:
            weight = weight.index_select(0, token_ids)
        return F.linear(hidden, weight)

    @staticmethod
    def ignored_checkpoint_keys(config: ModelConfig) -> set[str]:
        # Tied checkpoints sometimes still ship a copy of lm_head.weight.
        return {"lm_head.weight"} if config.tie_word_embeddings else set()
