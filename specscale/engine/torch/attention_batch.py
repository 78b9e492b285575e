"""Metadata of one flat, mixed forward batch.

The caller (scheduler) describes each row as new tokens + how many tokens of
that row are already in the paged KV cache + the row's block table. Decode rows
(1 new token) and prefill chunks (many new tokens over a cached prefix) mix
freely. Tokens of all rows are concatenated in row order ("flat batch"), as in
vLLM / FlashInfer varlen kernels.

Token ``i`` of a row with ``start`` cached tokens sits at position
``start + i`` and is written to slot ``block_table[p // block_size] *
block_size + p % block_size`` of every layer's cache.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any
from typing import Sequence

import torch

from specscale.engine.to_device import to_device


@dataclass(frozen=True)
class BatchRow:
    """One row of a forward batch, as the scheduler sees it.

    token_ids:   the new tokens to run (at least one).
    start:       tokens of this row already in the KV cache (= position of token_ids[0]).
    block_table: block ids holding positions 0.. of this row, in order; must cover
                 start + len(token_ids) positions. None: no KV cache (stateless
                 prefill, e.g. PRM scoring), which requires start == 0.
    """

    token_ids: Sequence[int]
    start: int = 0
    block_table: Sequence[int] | None = None


@dataclass(frozen=True)
class AttentionBatch:
    """Device tensors + host-side copies of the per-row lengths (so planning
    never forces a device sync). T = total new tokens, R = rows."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, start + i
    slot_mapping: torch.Tensor | None  # [T] int64 cache slot per new token; None = no KV cache
    cu_seqlens_q: torch.Tensor  # [R+1] int32, row r's tokens are [cu[r], cu[r+1])
    context_lens: torch.Tensor  # [R] int32, start + new tokens = keys each row attends to
    block_tables: torch.Tensor | None  # [R, max_blocks] int32, padded with -1
    query_lens: tuple[int, ...]  # host copy: new tokens per row
    start_positions: tuple[int, ...]  # host copy: cached tokens per row
    block_size: int
    # Host copy of block_tables (numpy int64, -1 padded): FlashInfer's plan() builds its
    # page indices from it without a device->host sync.
    host_block_tables: Any = field(default=None, compare=False, repr=False)

    @property
    def num_rows(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def uses_kv_cache(self) -> bool:
        return self.slot_mapping is not None

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_context_len(self) -> int:
        return max(s + q for s, q in zip(self.start_positions, self.query_lens))

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def host_cu_seqlens(self) -> list[int]:
        """``cu_seqlens_q`` from the host copy of the lengths (no device->host sync)."""
        return list(itertools.accumulate(self.query_lens, initial=0))

    def last_token_indices(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Flat indices of the last new token of ``rows`` (all rows if None)."""
        ends, total = [], 0
        for q in self.query_lens:
            total += q
            ends.append(total - 1)
        if rows is not None:
            for r in rows:
                if not 0 <= r < self.num_rows:
                    raise IndexError(f"row index {r} out of range for a batch of {self.num_rows} rows")
            ends = [ends[r] for r in rows]
        return to_device(ends, torch.long, self.device)

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[BatchRow],
        *,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        vocab_size: int | None = None,
        num_blocks: int | None = None,
    ) -> "AttentionBatch":
        """Build the batch, checking it against a model and cache first where given
        (context window, token ids in the vocabulary, block ids in the pool) and always
        against itself (slots written once). The explicit, validated entry point: engines
        build their per-iteration batches with ``BatchBuilder`` (batch_builder.py)."""
        from specscale.engine.torch.batch_builder import BatchBuilder

        return BatchBuilder(
            block_size, torch.device(device), max_positions=max_positions, vocab_size=vocab_size,
            num_blocks=num_blocks, debug_checks=True,
        ).from_rows(rows)
