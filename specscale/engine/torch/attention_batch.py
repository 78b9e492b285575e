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

import numpy as np
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
        return torch.tensor(ends, dtype=torch.long, device=self.device)

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
        """Build the batch; optionally check it against a model and cache first
        (context window, token ids in the vocabulary, block ids in the pool).

        Vectorised with numpy: this runs once per engine iteration, for every row."""
        if not rows:
            raise ValueError("a batch needs at least one row")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        n_cached = sum(r.block_table is not None for r in rows)
        if 0 < n_cached < len(rows):
            raise ValueError("either every row has a block table or none does (no-cache batch)")
        use_cache = n_cached > 0

        query_lens = tuple(len(r.token_ids) for r in rows)
        starts = tuple(int(r.start) for r in rows)
        if min(query_lens) == 0 or min(starts) < 0 or (not use_cache and max(starts) != 0):
            for i, (n, st) in enumerate(zip(query_lens, starts)):
                if n == 0:
                    raise ValueError(f"row {i} has no new tokens")
                if st < 0:
                    raise ValueError(f"row {i} has negative start {st}")
                if not use_cache and st != 0:
                    raise ValueError(f"row {i}: start={st} needs a block table (cached prefix)")
        n_rows, total = len(rows), sum(query_lens)
        qlen = np.asarray(query_lens, dtype=np.int64)
        start = np.asarray(starts, dtype=np.int64)
        ends = start + qlen
        if max_positions is not None and int(ends.max()) > max_positions:
            i = int(np.argmax(ends > max_positions))
            raise ValueError(
                f"row {i}: {ends[i]} tokens (start {starts[i]} + {query_lens[i]} new) exceed the "
                f"model's context window max_position_embeddings={max_positions}"
            )
        cu = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(qlen, out=cu[1:])
        ids = np.fromiter(itertools.chain.from_iterable(r.token_ids for r in rows), dtype=np.int64, count=total)
        if vocab_size is not None and total and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            k = int(np.argmax((ids < 0) | (ids >= vocab_size)))
            i = int(np.searchsorted(cu, k, side="right")) - 1
            raise ValueError(f"row {i}: token id {int(ids[k])} outside the vocabulary [0, {vocab_size})")
        row_of_token = np.repeat(np.arange(n_rows), qlen)
        positions = np.arange(total, dtype=np.int64) + np.repeat(start - cu[:-1], qlen)

        slots = tables = None
        if use_cache:
            widths = [len(r.block_table) for r in rows]
            width = max(widths)
            tables = np.array(
                [list(r.block_table) + [-1] * (width - w) for r, w in zip(rows, widths)], dtype=np.int64
            ).reshape(n_rows, width)
            if num_blocks is not None and width:
                valid = np.arange(width)[None, :] < np.asarray(widths)[:, None]
                bad = valid & ((tables < 0) | (tables >= num_blocks))
                if bad.any():
                    i, j = (int(x) for x in np.argwhere(bad)[0])
                    raise ValueError(f"row {i}: block id {int(tables[i, j])} out of range [0, {num_blocks})")
            needed = -(-ends // block_size)
            short = np.nonzero(np.asarray(widths) < needed)[0]
            if short.size:
                i = int(short[0])
                raise ValueError(
                    f"row {i}: block table has {widths[i]} blocks but {starts[i] + query_lens[i]} tokens "
                    f"need {needed[i]} blocks of {block_size}"
                )
            blocks = tables[row_of_token, positions // block_size]
            if (blocks < 0).any():
                i = int(row_of_token[np.argmax(blocks < 0)])
                raise ValueError(f"row {i}: negative block id {int(blocks.min())} in block table")
            slots = blocks * block_size + positions % block_size
            if (len(set(slots.tolist())) if total <= 4096 else np.unique(slots).size) != total:
                raise ValueError("two new tokens map to the same KV cache slot (rows share a block they both write)")

        def t(a, dtype):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

        return cls(
            input_ids=t(ids, torch.long),
            positions=t(positions, torch.long),
            slot_mapping=t(slots, torch.long) if use_cache else None,
            cu_seqlens_q=t(cu, torch.int32),
            context_lens=t(ends, torch.int32),
            block_tables=t(tables, torch.int32) if use_cache else None,
            query_lens=query_lens,
            start_positions=starts,
            block_size=block_size,
            host_block_tables=tables,
        )
