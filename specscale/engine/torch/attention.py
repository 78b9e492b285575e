"""Attention backends over the paged KV cache.

``AttentionBackend`` is the interface: ``plan`` runs once per model forward
(FlashInfer's plan/run split: index building is shared by all layers),
``forward`` runs once per layer. ``TorchAttentionBackend`` is the portable
reference: pure torch, CPU or CUDA, any float dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specscale.engine.torch.attention_batch import AttentionBatch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # K, V caches [num_blocks, block_size, kv_heads, head_dim]


class AttentionBackend(ABC):
    """Causal attention of each row's new tokens over its cached prefix and themselves."""

    name: str = "abstract"

    @abstractmethod
    def plan(self, batch: AttentionBatch) -> Any:
        """Backend-specific per-batch state, passed back to every ``forward``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim], RoPE applied
        k: torch.Tensor,  # [T, kv_heads, head_dim], RoPE applied
        v: torch.Tensor,  # [T, kv_heads, head_dim]
        kv_cache: LayerKV | None,
        plan: Any,
        scale: float,
    ) -> torch.Tensor:
        """Write k/v of the new tokens into ``kv_cache`` at ``batch.slot_mapping``
        (if the batch uses the cache), then return attention output [T, heads, head_dim]."""


@dataclass(frozen=True)
class _RowGroup:
    """Rows padded together to [rows, q_len] queries x [rows, k_len] keys."""

    token_index: torch.Tensor  # [Tg] flat token indices of the group's tokens
    pad_index: torch.Tensor  # [Tg] where each lands in the padded [rows * q_len] layout
    rows: int
    q_len: int
    k_len: int
    block_tables: torch.Tensor | None  # [rows, blocks covering k_len] int64
    mask: torch.Tensor  # [rows, 1, q_len, k_len] bool, True = may attend


@dataclass(frozen=True)
class TorchAttentionPlan:
    batch: AttentionBatch
    groups: tuple[_RowGroup, ...]


class TorchAttentionBackend(AttentionBackend):
    """Gather each row's keys through its block table, pad, and run masked SDPA.

    Decode rows (1 new token) and prefill rows are padded in separate groups so a
    long prefill chunk does not inflate every decode row to its query length.
    """

    name = "torch"

    def plan(self, batch: AttentionBatch) -> TorchAttentionPlan:
        decode = [r for r, q in enumerate(batch.query_lens) if q == 1]
        prefill = [r for r, q in enumerate(batch.query_lens) if q > 1]
        groups = tuple(self._plan_group(batch, rows) for rows in (decode, prefill) if rows)
        return TorchAttentionPlan(batch=batch, groups=groups)

    @staticmethod
    def _plan_group(batch: AttentionBatch, rows: list[int]) -> _RowGroup:
        dev = batch.device
        qlens = [batch.query_lens[r] for r in rows]
        starts = [batch.start_positions[r] for r in rows] if batch.uses_kv_cache else [0] * len(rows)
        q_len = max(qlens)
        k_len = max(s + q for s, q in zip(starts, qlens))
        cu = [0]
        for q in batch.query_lens:
            cu.append(cu[-1] + q)
        token_index, pad_index, q_pos = [], [], []
        for g, (r, q, s) in enumerate(zip(rows, qlens, starts)):
            token_index.extend(range(cu[r], cu[r] + q))
            pad_index.extend(range(g * q_len, g * q_len + q))
            # Padding queries repeat the row's last position: they see only real
            # keys (no all-masked rows, hence no NaN) and their output is dropped.
            q_pos.append([s + min(i, q - 1) for i in range(q_len)])
        q_pos_t = torch.tensor(q_pos, dtype=torch.long, device=dev)
        mask = torch.arange(k_len, device=dev)[None, None, :] <= q_pos_t[:, :, None]
        block_tables = None
        if batch.uses_kv_cache:
            n_blocks = -(-k_len // batch.block_size)
            idx = torch.tensor(rows, dtype=torch.long, device=dev)
            # -1 padding only occurs past a row's own keys (masked), any valid block will do.
            block_tables = batch.block_tables.index_select(0, idx)[:, :n_blocks].long().clamp_min(0)
        return _RowGroup(
            token_index=torch.tensor(token_index, dtype=torch.long, device=dev),
            pad_index=torch.tensor(pad_index, dtype=torch.long, device=dev),
            rows=len(rows),
            q_len=q_len,
            k_len=k_len,
            block_tables=block_tables,
            mask=mask.unsqueeze(1),
        )

    def forward(self, q, k, v, kv_cache, plan: TorchAttentionPlan, scale: float) -> torch.Tensor:
        batch = plan.batch
        num_heads, head_dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        use_cache = batch.uses_kv_cache
        if use_cache:
            if kv_cache is None:
                raise ValueError("batch has a slot mapping but no KV cache was given")
            k_cache, v_cache = kv_cache
            k_cache.view(-1, kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
            v_cache.view(-1, kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)

        out = torch.empty_like(q)
        for grp in plan.groups:
            qg = self._pad(q, grp).view(grp.rows, grp.q_len, num_heads, head_dim)
            if use_cache:
                block_size = k_cache.shape[1]
                n_keys = grp.block_tables.shape[1] * block_size
                kg = k_cache[grp.block_tables].view(grp.rows, n_keys, kv_heads, head_dim)[:, : grp.k_len]
                vg = v_cache[grp.block_tables].view(grp.rows, n_keys, kv_heads, head_dim)[:, : grp.k_len]
            else:
                kg = self._pad(k, grp).view(grp.rows, grp.q_len, kv_heads, head_dim)
                vg = self._pad(v, grp).view(grp.rows, grp.q_len, kv_heads, head_dim)
            og = F.scaled_dot_product_attention(
                qg.transpose(1, 2),
                kg.transpose(1, 2),
                vg.transpose(1, 2),
                attn_mask=grp.mask,
                scale=scale,
                enable_gqa=num_heads != kv_heads,
            )
            og = og.transpose(1, 2).reshape(grp.rows * grp.q_len, num_heads, head_dim)
            out.index_copy_(0, grp.token_index, og.index_select(0, grp.pad_index))
        return out

    @staticmethod
    def _pad(x: torch.Tensor, grp: _RowGroup) -> torch.Tensor:
        padded = x.new_zeros(grp.rows * grp.q_len, *x.shape[1:])
        return padded.index_copy_(0, grp.pad_index, x.index_select(0, grp.token_index))


def make_attention_backend(name: str = "torch") -> AttentionBackend:
    """Factory used by configs; FlashInfer registers here once it exists."""
    if name == "torch":
        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r} (available: 'torch')")
