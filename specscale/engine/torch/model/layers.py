"""Small building blocks shared by the Qwen2 and Llama decoders."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specscale.engine.torch.model.hot_ops import EAGER_OPS, HotOps, rms_norm


class RMSNorm(nn.Module):
    """Holds the norm's weight and eps; the math is ``hot_ops.rms_norm`` (float32 inside,
    as transformers). Decoders call it through their op set (``norm`` / ``add_norm``)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def norm(self, x: torch.Tensor, ops: HotOps = EAGER_OPS) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor, ops: HotOps = EAGER_OPS):
        """(norm(x + residual), x + residual)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

        # Fused [gate; up] (set by fuse_projections); non-persistent buffers, moved by .to().
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.register_buffer("gate_up_bias", None, persistent=False)

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One [gate; up] matrix; gate_proj/up_proj become views into it (names kept)."""
        self.gate_up_weight = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        n = self.gate_proj.out_features
        self.gate_proj.weight = nn.Parameter(self.gate_up_weight[:n], requires_grad=False)
        self.up_proj.weight = nn.Parameter(self.gate_up_weight[n:], requires_grad=False)
        if self.gate_proj.bias is not None:
            self.gate_up_bias = torch.cat([self.gate_proj.bias, self.up_proj.bias])
            self.gate_proj.bias = nn.Parameter(self.gate_up_bias[:n], requires_grad=False)
            self.up_proj.bias = nn.Parameter(self.gate_up_bias[n:], requires_grad=False)

    def forward(self, x: torch.Tensor, ops: HotOps = EAGER_OPS) -> torch.Tensor:
        if self.gate_up_weight is not None:
            return self.down_proj(ops.silu_mul(F.linear(x, self.gate_up_weight, self.gate_up_bias)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
