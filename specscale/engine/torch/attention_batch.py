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

from dataclasses import dataclass
from typing import Sequence

import torch


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
        return torch.tensor(ends, dtype=torch.long, device=self.device)

    @classmethod
    def from_rows(
        cls, rows: Sequence[BatchRow], *, block_size: int = 16, device: torch.device | str = "cpu"
    ) -> "AttentionBatch":
        if not rows:
            raise ValueError("a batch needs at least one row")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        with_cache = [r.block_table is not None for r in rows]
        if any(with_cache) and not all(with_cache):
            raise ValueError("either every row has a block table or none does (no-cache batch)")
        use_cache = with_cache[0]

        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for i, row in enumerate(rows):
            n = len(row.token_ids)
            if n == 0:
                raise ValueError(f"row {i} has no new tokens")
            if row.start < 0:
                raise ValueError(f"row {i} has negative start {row.start}")
            ids.extend(int(t) for t in row.token_ids)
            positions.extend(range(row.start, row.start + n))
            if not use_cache:
                if row.start != 0:
                    raise ValueError(f"row {i}: start={row.start} needs a block table (cached prefix)")
                continue
            table = row.block_table
            needed = -(-(row.start + n) // block_size)
            if len(table) < needed:
                raise ValueError(
                    f"row {i}: block table has {len(table)} blocks but {row.start + n} tokens "
                    f"need {needed} blocks of {block_size}"
                )
            for p in range(row.start, row.start + n):
                block = table[p // block_size]
                if block < 0:
                    raise ValueError(f"row {i}: negative block id {block} in block table")
                slots.append(block * block_size + p % block_size)
        if use_cache and len(set(slots)) != len(slots):
            raise ValueError("two new tokens map to the same KV cache slot (rows share a block they both write)")

        query_lens = tuple(len(r.token_ids) for r in rows)
        starts = tuple(int(r.start) for r in rows)
        cu = [0]
        for q in query_lens:
            cu.append(cu[-1] + q)
        block_tables = None
        if use_cache:
            width = max(len(r.block_table) for r in rows)
            padded = [list(r.block_table) + [-1] * (width - len(r.block_table)) for r in rows]
            block_tables = torch.tensor(padded, dtype=torch.int32, device=device)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device) if use_cache else None,
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            context_lens=torch.tensor([s + q for s, q in zip(starts, query_lens)], dtype=torch.int32, device=device),
            block_tables=block_tables,
            query_lens=query_lens,
            start_positions=starts,
            block_size=block_size,
        )
