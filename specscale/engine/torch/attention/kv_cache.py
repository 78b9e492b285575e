"""Paged KV cache storage (tensors only).

Layout: one tensor [2, layers, num_blocks, block_size, kv_heads, head_dim];
``layer(i)`` gives that layer's K and V caches, each
[num_blocks, block_size, kv_heads, head_dim] (FlashInfer's "NHD" paged layout).
Which blocks belong to which sequence, refcounts and forks are the block
manager's business; this class only stores data and copies blocks on request.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specscale.engine.to_device import to_device
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.attention.huge_pages import advise_huge_pages


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Zero-initialised so a gather of padding blocks never reads NaN garbage; on the CPU
        # backed by 2 MB pages where the OS allows (advised before the first write: see
        # huge_pages.py), as decode reads it in scattered 4 KB blocks.
        self.kv = torch.empty(
            2, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )
        advise_huge_pages(self.kv)
        self.kv.zero_()

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> "PagedKVCache":
        return cls(
            config.num_hidden_layers, num_blocks, block_size, config.num_key_value_heads, config.head_dim, dtype, device
        )

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """K + V bytes of one block across all layers (for memory accounting)."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * elem

    @classmethod
    def blocks_for_budget(cls, config: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype) -> int:
        return budget_bytes // cls.bytes_per_block(config, block_size, dtype)

    @property
    def num_layers(self) -> int:
        return self.kv.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[0, i], self.kv[1, i]

    def copy_block(self, src: int | Sequence[int], dst: int | Sequence[int]) -> None:
        """Copy whole block(s) ``src`` -> ``dst`` in every layer, K and V
        (copy-on-write of a forked sequence's partial last block)."""
        src_ids = [src] if isinstance(src, int) else list(src)
        dst_ids = [dst] if isinstance(dst, int) else list(dst)
        if len(src_ids) != len(dst_ids):
            raise ValueError(f"copy_block: {len(src_ids)} sources but {len(dst_ids)} destinations")
        if len(set(dst_ids)) != len(dst_ids):
            raise ValueError("copy_block: duplicate destination blocks")
        for b in src_ids + dst_ids:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"copy_block: block id {b} out of range [0, {self.num_blocks})")
        if not src_ids:
            return
        s = to_device(src_ids, torch.long, self.device)
        d = to_device(dst_ids, torch.long, self.device)
        # Advanced indexing on the right makes a copy first, so overlapping src/dst is safe.
        self.kv[:, :, d] = self.kv[:, :, s]

    def check_block_ids(self, block_tables: Sequence[Sequence[int] | None]) -> None:
        for i, table in enumerate(block_tables):
            if not table:
                continue
            lo, hi = min(table), max(table)
            if lo < 0 or hi >= self.num_blocks:
                b = lo if lo < 0 else hi
                raise ValueError(f"row {i}: block id {b} out of range [0, {self.num_blocks})")
