"""The paired sampler: one implementation shared by every backend (docs/design.md §4).

Each logical member draws its next token by inverse CDF with its own counter-based
uniform, over the temperature-scaled, top-p filtered distribution of the physical row
it belongs to, in fixed token-id order. Because the uniform depends only on (lineage
key, token index), the same logits give the same token for the same logical candidate
under any policy, batch composition or deduplication.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specscale.hashing import paired_uniforms
from specscale.engine.to_device import to_device


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def filtered_cdf(logits: torch.Tensor, params: SamplingParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Unnormalised CDF per row, in token-id order, after temperature and top-p.

    Top-p keeps the smallest set of most probable tokens whose mass reaches top_p
    (stable sort, so ties keep token order); the CDF is then built over the kept
    tokens in their original order, which keeps the draw a monotone map of u.
    """
    probs = torch.softmax(logits.to(dtype) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = mass_before < params.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
    return torch.cumsum(probs, dim=-1)


def sample_rows(
    logits: torch.Tensor,
    member_rows: np.ndarray,
    member_keys: np.ndarray,
    member_token_index: np.ndarray,
    params: SamplingParams,
) -> np.ndarray:
    """Draw one token per logical member.

    logits: [rows, vocab]; member_rows[i] is the row member i reads (several members
    may read one row: computation deduplication); member_keys / member_token_index
    give each member's lineage key and 0-based token index within its step.
    Returns int64 token ids, one per member.
    """
    if len(member_rows) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(member_rows) == logits.shape[0] and np.array_equal(member_rows, np.arange(len(member_rows))):
        rows = None  # one member per row, in order: no gather (the same values)
    else:
        rows = to_device(member_rows, torch.long, logits.device)
    u = None if params.temperature == 0.0 else paired_uniforms(member_keys, member_token_index)
    return draw(logits, rows, u, params)


def draw(logits: torch.Tensor, rows: torch.Tensor | None, u: np.ndarray | None, params: SamplingParams) -> np.ndarray:
    """The sampler's tensor math (device work on a GPU): each member's row of ``logits``
    (``rows``; None = row i for member i), its filtered CDF, and the token its uniform ``u``
    lands on (greedy: the argmax, lowest id among ties). Only the token ids come back."""
    if params.temperature == 0.0:
        return torch.argmax(logits if rows is None else logits[rows], dim=-1).cpu().numpy()
    cdf = filtered_cdf(logits, params)
    if rows is not None:
        cdf = cdf[rows]
    targets = (to_device(u, cdf.dtype, cdf.device) * cdf[:, -1]).unsqueeze(-1)
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return tokens.clamp_(max=logits.shape[-1] - 1).cpu().numpy()
