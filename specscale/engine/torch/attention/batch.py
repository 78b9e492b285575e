"""Metadata of one flat, mixed forward batch.

The caller (scheduler) describes each row as new tokens + how many tokens of
that row are already in the paged KV cache + the row's block table. Decode rows
(1 new token) and prefill chunks (many new tokens over a cached prefix) mix
freely. Tokens of all rows are concatenated in row order ("flat batch"), as in
vLLM / FlashInfer varlen kernels.

Token ``i`` of a row with ``start`` cached tokens sits at position
``start + i`` and is written to slot ``block_table[p // block_size] *
block_size + p % block_size`` of every layer's cache.

How a batch is built (``BatchBuilder``, below the batch's own types):
Building the per-iteration ``AttentionBatch`` with numpy, never per block in Python.

At serving scale (256 decode rows at 2k context, 16-token blocks) a batch holds ~32k
block ids. Converting each row's block list to numpy every iteration is what made batch
building cost ~1 ms; here each physical sequence keeps a numpy copy of its block table
(``TableMirror``) that only appends the blocks added since the last iteration, and the
batch's padded table is one concatenate + scatter. Tensors leave the host through
``HostStaging``: pinned buffers with non-blocking copies on CUDA, zero-copy views on CPU.

Checks that cost a pass over every token or block (vocabulary range, block-id range,
slot uniqueness) run only with ``debug_checks`` (the tests turn it on; see
``debug_checks_default``); the O(rows) checks (context window, table long enough) always run.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
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
        build their per-iteration batches with ``BatchBuilder`` (BatchBuilder, batch.py)."""
        return BatchBuilder(
            block_size, torch.device(device), max_positions=max_positions, vocab_size=vocab_size,
            num_blocks=num_blocks, debug_checks=True,
        ).from_rows(rows)


DEBUG_ENV = "SPECSCALE_DEBUG_CHECKS"


def debug_checks_default() -> bool:
    """engine.debug_checks when not set: on if $SPECSCALE_DEBUG_CHECKS is 1/true (tests)."""
    return os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")


# ---------------------------------------------------------------- block tables
class TableMirror:
    """A numpy copy of one sequence's block-table list, refreshed by appending.

    Between two iterations the scheduler changes a live table only by appending blocks and
    by replacing its last (partial) block on copy-on-write; it clears it in place only on a
    preemption (counted in ``seq.preemptions``) and otherwise assigns a new list. So the
    copy is current when it was made from the same list object at the same preemption
    count and still ends with the list's last block; then only the tail is new. Debug mode
    compares the whole copy with the list (``table_of``)."""

    __slots__ = ("src", "preemptions", "array", "n", "last", "view")

    def __init__(self, src: list, preemptions: int):
        self.src, self.preemptions = src, preemptions
        self.array = np.empty(max(len(src), 8), dtype=np.int64)
        self.n, self.last = 0, None
        self.view = self.array[:0]

    def sync(self, blocks: list) -> np.ndarray:
        n, m = len(blocks), self.n
        if n > self.array.shape[0]:
            grown = np.empty(max(2 * self.array.shape[0], n), dtype=np.int64)
            grown[:m] = self.array[:m]
            self.array = grown
        if n > m:
            self.array[m:n] = blocks[m:n]
        self.n = n
        self.last = blocks[-1] if n else None
        self.view = self.array[:n]
        return self.view


def table_of(seq: Any, debug: bool = False) -> np.ndarray:
    """The sequence's block table as an int64 array (a view of its mirror)."""
    blocks = seq.blocks
    m = seq.table_mirror
    if m is None or m.src is not blocks or m.preemptions != seq.preemptions or len(blocks) < m.n or (
        m.n and blocks[m.n - 1] != m.array[m.n - 1]
    ):
        m = seq.table_mirror = TableMirror(blocks, seq.preemptions)
    out = m.view if len(blocks) == m.n and (not blocks or blocks[-1] == m.last) else m.sync(blocks)
    if debug and not np.array_equal(out, np.asarray(blocks, dtype=np.int64).reshape(-1)):
        raise AssertionError(f"sequence {seq.sid}: block-table mirror out of date")
    return out


def tables_of(seqs: Sequence[Any]) -> tuple[list[np.ndarray], list[int]]:
    """``table_of`` for many sequences, and their lengths; the common case (nothing changed
    since the last iteration, or blocks appended) inlined: this runs for every row of every
    iteration."""
    out, widths = [], []
    append, width = out.append, widths.append
    for seq in seqs:
        blocks, m = seq.blocks, seq.table_mirror
        n = len(blocks)
        width(n)
        if m is not None and m.src is blocks and m.preemptions == seq.preemptions:
            if n == m.n:
                if not n or blocks[-1] == m.last:
                    append(m.view)
                    continue
            elif n > m.n and (not m.n or blocks[m.n - 1] == m.last):
                append(m.sync(blocks))
                continue
        append(table_of(seq))
    return out, widths


def pad_tables(arrays: Sequence[np.ndarray], widths: np.ndarray) -> np.ndarray:
    """Rows of different lengths as one [rows, max width] int64 array padded with -1."""
    flat = np.concatenate(arrays) if len(arrays) > 1 else np.asarray(arrays[0], dtype=np.int64)
    width = int(widths.max()) if widths.size else 0
    if widths.size and int(widths.min()) == width:
        return flat.reshape(len(arrays), width)
    table = np.full((len(arrays), width), -1, dtype=np.int64)
    table[np.arange(width)[None, :] < widths[:, None]] = flat
    return table


def slot_mapping(table: np.ndarray, row_of_token: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Each new token's KV cache slot: its row's block holding its position, times the block
    size, plus its offset in that block."""
    return table[row_of_token, positions // block_size] * block_size + positions % block_size


# ---------------------------------------------------------------- host -> device
class HostStaging:
    """One staging buffer per batch tensor. On CUDA: pinned host memory, grown by doubling,
    copied with ``non_blocking=True``; an event recorded after the copies says when a buffer
    may be written again (normally long done: the iteration waits for the device once
    anyway). If it is not done (several batches built before any runs, e.g. the chunks of
    a PRM batch), fresh buffers are taken instead of waiting: PyTorch's pinned allocator
    keeps the old ones until the copies recorded on them have run. So building a batch
    never waits for the device. On CPU the numpy arrays become tensors without a copy."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda" and torch.cuda.is_available()
        self._buffers: dict[str, torch.Tensor] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self._event = None

    def scratch(self, name: str, size: int, dtype: np.dtype) -> np.ndarray:
        """A reused host array of ``size`` elements to lay a large batch input out in. Fresh
        memory takes a page fault per 4 KB page on its first write (measured: a 2 MB array
        filled ~10x slower fresh than reused, on a VM), so the PRM's flat token ids and
        positions are written into arrays kept here. Its contents, and CPU tensors ``put``
        from it (which share its memory), stay valid until the next ``scratch`` of that name:
        a batch's forwards run before the next batch is laid out. On CUDA ``put`` copies it
        into pinned memory at once."""
        buf = self._scratch.get(name)
        if buf is None or buf.shape[0] < size or buf.dtype != dtype:
            cap = max(size, 2 * (buf.shape[0] if buf is not None else 0), 1024)
            buf = self._scratch[name] = np.empty(cap, dtype=dtype)
        return buf[:size]

    def begin(self) -> None:
        if self._event is not None:
            if not self._event.query():
                self._buffers = {}  # still being copied from: not reused, not waited for
            self._event = None

    def put(self, name: str, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        if not self.pinned:
            t = torch.from_numpy(np.ascontiguousarray(array))
            return t if t.dtype == dtype and t.device == self.device else t.to(self.device, dtype)
        flat = np.ascontiguousarray(array).reshape(-1)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < flat.size or buf.dtype != dtype:
            cap = max(flat.size, 2 * (buf.numel() if buf is not None else 0), 256)
            buf = self._buffers[name] = torch.empty(cap, dtype=dtype, pin_memory=True)
        view = buf[: flat.size]
        view.numpy()[:] = flat
        return view.view(array.shape).to(self.device, non_blocking=True)

    def end(self) -> None:
        if self.pinned:
            self._event = torch.cuda.Event()
            self._event.record()


# ---------------------------------------------------------------- the batch
@dataclass
class BatchBuilder:
    """Builds every forward batch of one model + cache (``ModelRunner`` owns one)."""

    block_size: int
    device: torch.device
    max_positions: int | None = None
    vocab_size: int | None = None
    num_blocks: int | None = None
    debug_checks: bool = field(default_factory=debug_checks_default)
    staging: HostStaging = field(init=False)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        self.staging = HostStaging(self.device)

    def gen_batch(self, gen) -> AttentionBatch:
        """The batch of a scheduler iteration (``GenBatch`` rows: sequence, cached tokens,
        new tokens): new token ids read from the histories, tables from the mirrors."""
        rows = gen.rows
        qlens = [r.n_new for r in rows]
        starts = [r.start for r in rows]
        if max(qlens) == 1:  # a decode batch: one token per row
            ids = np.array([r.seq.tokens[r.start] for r in rows], dtype=np.int64)
        else:
            ids = np.concatenate([np.asarray(r.seq.tokens[r.start: r.start + r.n_new], dtype=np.int64)
                                  for r in rows])
        if self.debug_checks:
            tables = [table_of(r.seq, True) for r in rows]
            widths = [t.shape[0] for t in tables]
        else:
            tables, widths = tables_of([r.seq for r in rows])
        return self.build(ids, qlens, starts, tables, widths)

    def from_rows(self, rows: Sequence[BatchRow]) -> AttentionBatch:
        """The batch of explicit ``BatchRow``s (block tables as lists or arrays, or all None)."""
        if not rows:
            raise ValueError("a batch needs at least one row")
        qlens = [len(r.token_ids) for r in rows]
        ids = np.concatenate([np.asarray(r.token_ids, dtype=np.int64).reshape(-1) for r in rows])
        n_cached = sum(r.block_table is not None for r in rows)
        if 0 < n_cached < len(rows):
            raise ValueError("either every row has a block table or none does (no-cache batch)")
        tables = [np.asarray(r.block_table, dtype=np.int64).reshape(-1) for r in rows] if n_cached else None
        return self.build(ids, qlens, [int(r.start) for r in rows], tables)

    def build(self, ids: np.ndarray, qlens: list[int], starts: list[int],
              tables: Sequence[np.ndarray] | None, widths: list[int] | None = None) -> AttentionBatch:
        """tables: each row's block table (None: a no-cache batch); widths: their lengths, when
        the caller has them."""
        if not qlens:
            raise ValueError("a batch needs at least one row")
        bs = self.block_size
        if bs <= 0:
            raise ValueError(f"block_size must be positive, got {bs}")
        qlen = np.asarray(qlens, dtype=np.int64)
        start = np.asarray(starts, dtype=np.int64)
        use_cache = tables is not None
        if int(qlen.min()) == 0 or int(start.min()) < 0 or (not use_cache and int(start.max()) != 0):
            for i, (n, st) in enumerate(zip(qlens, starts)):
                if n == 0:
                    raise ValueError(f"row {i} has no new tokens")
                if st < 0:
                    raise ValueError(f"row {i} has negative start {st}")
                if not use_cache and st != 0:
                    raise ValueError(f"row {i}: start={st} needs a block table (cached prefix)")
        ends = start + qlen
        if self.max_positions is not None and int(ends.max()) > self.max_positions:
            i = int(np.argmax(ends > self.max_positions))
            raise ValueError(
                f"row {i}: {ends[i]} tokens (start {starts[i]} + {qlens[i]} new) exceed the "
                f"model's context window max_position_embeddings={self.max_positions}"
            )
        n_rows, total = len(qlens), int(ids.shape[0])
        cu = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(qlen, out=cu[1:])
        if self.debug_checks and self.vocab_size is not None and total:
            bad = (ids < 0) | (ids >= self.vocab_size)
            if bad.any():
                k = int(np.argmax(bad))
                i = int(np.searchsorted(cu, k, side="right")) - 1
                raise ValueError(f"row {i}: token id {int(ids[k])} outside the vocabulary [0, {self.vocab_size})")
        if total == n_rows:  # one token per row: no repeat needed
            positions = start.copy()
            row_of_token = None
        else:
            row_of_token = np.repeat(np.arange(n_rows), qlen)
            positions = np.arange(total, dtype=np.int64) + np.repeat(start - cu[:-1], qlen)

        slots = table = None
        if use_cache:
            widths = (np.asarray(widths, dtype=np.int64) if widths is not None
                      else np.fromiter((t.shape[0] for t in tables), dtype=np.int64, count=n_rows))
            needed = -(-ends // bs)
            short = np.nonzero(widths < needed)[0]
            if short.size:
                i = int(short[0])
                raise ValueError(
                    f"row {i}: block table has {widths[i]} blocks but {starts[i] + qlens[i]} tokens "
                    f"need {needed[i]} blocks of {bs}"
                )
            table = pad_tables(tables, widths)
            if self.debug_checks:
                self._check_blocks(table, widths)
            rows_idx = np.arange(n_rows) if row_of_token is None else row_of_token
            slots = slot_mapping(table, rows_idx, positions, bs)
            if self.debug_checks and (slots < 0).any():  # (a slot is negative iff its block id is)
                i = int(rows_idx[np.argmax(slots < 0)])
                raise ValueError(f"row {i}: negative block id {int(slots.min()) // bs} in block table")
            if self.debug_checks and np.unique(slots).size != total:
                raise ValueError("two new tokens map to the same KV cache slot (rows share a block they both write)")

        st = self.staging
        st.begin()
        batch = AttentionBatch(
            input_ids=st.put("input_ids", ids, torch.long),
            positions=st.put("positions", positions, torch.long),
            slot_mapping=st.put("slot_mapping", slots, torch.long) if use_cache else None,
            cu_seqlens_q=st.put("cu_seqlens_q", cu.astype(np.int32), torch.int32),
            context_lens=st.put("context_lens", ends.astype(np.int32), torch.int32),
            block_tables=st.put("block_tables", table.astype(np.int32), torch.int32) if use_cache else None,
            query_lens=tuple(qlens),
            start_positions=tuple(starts),
            block_size=bs,
            host_block_tables=table,
        )
        st.end()
        return batch

    def _check_blocks(self, table: np.ndarray, widths: np.ndarray) -> None:
        if self.num_blocks is None or not table.shape[1]:
            return
        valid = np.arange(table.shape[1])[None, :] < widths[:, None]
        bad = valid & ((table < 0) | (table >= self.num_blocks))
        if bad.any():
            i, j = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"row {i}: block id {int(table[i, j])} out of range [0, {self.num_blocks})")
