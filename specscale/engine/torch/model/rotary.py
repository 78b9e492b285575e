"""Rotary position embedding (RoPE), plain and with Llama-3 frequency scaling.

Numerics deliberately follow transformers: inverse frequencies and the
cos/sin tables are computed in float32 and cast to the model dtype afterwards.
That makes our logits equal the reference to round-off in every dtype
(float64 included), at the price of float32-accurate angles.

The tables are built once per device and dtype over every position of the window
and a forward only gathers its rows. Each entry is an elementwise function of its
position (float32 product, cos/sin, cast), so a row of the table is bit-identical to
what computing the same position on the fly gives (``RotaryEmbedding.compute``, kept
as the reference; tests/engine/torch/test_rotary_table.py holds them equal).
"""

from __future__ import annotations

import math

import torch

from specscale.engine.torch.model_config import ModelConfig, RopeScaling


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


# Rows of the table computed per pass while building it: bounds the float32 temporaries
# (a 128k-position window of head_dim 128 would otherwise need ~200 MB at once).
BUILD_CHUNK = 16384


class RotaryEmbedding:
    """Maps token positions to (cos, sin) tables; not an nn.Module on purpose:
    it holds no weights, so meta-device model construction never touches it.

    ``max_positions`` rows are tabulated (the config's window; ``reserve`` extends it,
    for a PRM whose window is overridden past the config). Positions beyond the table
    are the caller's error: both models check the window on the host before a forward."""

    def __init__(self, config: ModelConfig):
        if config.rope_scaling is None:
            self.inv_freq = default_inv_freq(config.head_dim, config.rope_theta)
        else:
            self.inv_freq = llama3_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.max_positions = config.max_position_embeddings
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def reserve(self, max_positions: int) -> None:
        """Tabulate at least ``max_positions`` positions (tables already built are rebuilt
        on next use; call before serving: a captured CUDA graph keeps the old table)."""
        if max_positions > self.max_positions:
            self.max_positions = int(max_positions)
            self._tables.clear()

    def table(self, device: torch.device | str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_positions, head_dim] in ``dtype`` on ``device``, built on first use
        (the models build theirs at load time, so no forward pays for it)."""
        key = (torch.device(device), dtype)
        cached = self._tables.get(key)
        if cached is None:
            cached = self._tables[key] = self._build(key[0], dtype)
        return cached

    def _build(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        width = 2 * self.inv_freq.shape[0]
        cos = torch.empty(self.max_positions, width, dtype=dtype, device=device)
        sin = torch.empty_like(cos)
        for lo in range(0, self.max_positions, BUILD_CHUNK):
            hi = min(lo + BUILD_CHUNK, self.max_positions)
            cos[lo:hi], sin[lo:hi] = self.compute(torch.arange(lo, hi, device=device), dtype)
        return cos, sin

    def compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The formula itself (transformers' order of operations): positions [T] -> cos, sin
        [T, head_dim] in ``dtype``, computed on positions' device."""
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, head_dim] in ``dtype``: rows of the cached table."""
        cos, sin = self.table(positions.device, dtype)
        return cos.index_select(0, positions), sin.index_select(0, positions)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim] (half-split layout, as in HF checkpoints)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin
