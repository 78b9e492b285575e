"""Rotary position embedding (RoPE), plain and with Llama-3 frequency scaling.

Numerics deliberately follow transformers: inverse frequencies and the
cos/sin tables are computed in float32 and cast to the model dtype afterwards.
That makes our logits equal the reference to round-off in every dtype
(float64 included), at the price of float32-accurate angles.
"""

from __future__ import annotations

import math

import torch

from specscale.engine.torch.config import ModelConfig, RopeScaling


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim))


def llama3_inv_freq(head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: keep high frequencies, divide low ones by ``factor``,
    interpolate smoothly in between. Same operation order as the reference so
    the float32 result is bit-identical."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim)
    )
    old_context_len = s.original_max_position_embeddings
    low_freq_wavelen = old_context_len / s.low_freq_factor
    high_freq_wavelen = old_context_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_context_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / s.factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


class RotaryEmbedding:
    """Maps token positions to (cos, sin) tables; not an nn.Module on purpose:
    it holds no weights, so meta-device model construction never touches it."""

    def __init__(self, config: ModelConfig):
        if config.rope_scaling is None:
            self.inv_freq = default_inv_freq(config.head_dim, config.rope_theta)
        else:
            self.inv_freq = llama3_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, head_dim] in ``dtype``."""
        inv_freq = self._on_device.get(positions.device)
        if inv_freq is None:
            inv_freq = self._on_device[positions.device] = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim] (half-split layout, as in HF checkpoints)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin
