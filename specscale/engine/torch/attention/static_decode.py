"""Fixed-shape decode inputs, for replaying captured CUDA graphs.

A captured graph replays the same kernels on the same memory, so every per-iteration
input of a decode step must live in a buffer of fixed shape that the host refills before
each replay. ``StaticDecode`` is that set of buffers for one bucket of ``rows`` rows (and,
for backends whose plan is a tensor computation, ``pages`` KV pages per row), plus the
attention plan over them. The attention backend makes it (``AttentionBackend.static_decode``).

Rows beyond a batch's real ones are padding: token 0 at position 0, whose K/V go to, and
whose attention reads, one reserved ``pad_block`` that the scheduler never hands out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from specscale.engine.torch.attention.batch import AttentionBatch


def decode_pages(batch: AttentionBatch) -> int:
    """KV pages the longest row of a decode batch reads (its context, new token included)."""
    return -(-batch.max_context_len // batch.block_size)


class StaticDecode(ABC):
    def __init__(self, rows: int, pages: int, block_size: int, device: torch.device):
        self.rows, self.pages, self.block_size, self.device = rows, pages, block_size, device
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=device)

    def load(self, batch: AttentionBatch | None, pad_block: int) -> None:
        """Copy a decode batch of at most ``rows`` rows into the buffers (None: all padding),
        outside any graph. Padding rows write and read ``pad_block`` only."""
        n = 0 if batch is None else batch.num_rows
        if n > self.rows:
            raise ValueError(f"a decode batch of {n} rows does not fit a bucket of {self.rows}")
        if batch is not None:
            if batch.max_query_len != 1 or not batch.uses_kv_cache:
                raise ValueError("static decode buffers take cached decode batches (one new token per row)")
            if decode_pages(batch) > self.pages:
                raise ValueError(f"the batch reads {decode_pages(batch)} KV pages per row, the bucket {self.pages}")
            self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
            self.positions[:n].copy_(batch.positions, non_blocking=True)
            self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
        if n < self.rows:
            self.input_ids[n:].zero_()
            self.positions[n:].zero_()
            self.slot_mapping[n:].fill_(pad_block * self.block_size)
        self._load_attention(batch, n, pad_block)

    @abstractmethod
    def _load_attention(self, batch: AttentionBatch | None, n: int, pad_block: int) -> None:
        """Backend part of ``load``: block tables / page indices of the n real rows, padded."""

    @abstractmethod
    def plan(self) -> Any:
        """The attention plan over the buffers; called inside the capture, so it may only
        run device work on the buffers (no host reads of per-batch data)."""
