"""A PRM batch's forward inputs, built flat: every row of one kind in one numpy pass.

A 256-task batch of whole paths (~2k tokens each) runs as ~86 forwards under the PRM's
8k-token budget. Building each forward's ``AttentionBatch`` on its own (concatenation,
positions, lengths, reward index, a host-to-device copy per tensor) cost ~50 us of host
time per forward. Here the rows of one kind (cached or not) are checked, packed and laid
out once: one array per tensor for all of them, uploaded once (``HostStaging``: pinned,
non-blocking on CUDA), and each forward's batch holds slices of those tensors.

Per chunk, ``cu_seqlens_q`` restarts at 0 and the reward index counts from the chunk's
first token, exactly as a batch built for that chunk alone would hold them (the tests
compare the two).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from specscale.engine.text.prm_rows import TokenRun
from specscale.engine.torch.attention.batch import AttentionBatch, HostStaging, pad_tables, slot_mapping


def token_parts(token_ids: Any) -> tuple[np.ndarray, ...]:
    if isinstance(token_ids, TokenRun):
        return token_ids.parts
    return (np.asarray(token_ids).reshape(-1),)


@dataclass(frozen=True)
class PRMChunk:
    """One PRM forward, ready to run: the rows it holds (indices into the caller's rows),
    its batch, and the flat token indices whose hidden states give rewards (None: none)."""

    members: list[int]
    batch: AttentionBatch
    reward_index: torch.Tensor | None
    cached: bool


@dataclass(frozen=True)
class RowArrays:
    """The O(rows) facts of a PRM batch's rows, as arrays (what the checks and packing read)."""

    lens: np.ndarray  # new tokens per row
    starts: np.ndarray  # cached tokens per row
    cached: np.ndarray  # bool: has a block table
    n_rewards: np.ndarray  # reward positions per row
    reward_at: np.ndarray  # every row's reward positions, concatenated in row order
    reward_row: np.ndarray  # the row of each of them

    @classmethod
    def of(cls, rows: Sequence[Any]) -> "RowArrays":
        n = len(rows)
        n_rewards = np.fromiter((len(r.reward_positions) for r in rows), np.int64, n)
        # One pass over every row's positions (tuples from PRMPaths: an array per row cost ~1 us each)
        at = np.fromiter(itertools.chain.from_iterable(r.reward_positions for r in rows), np.int64,
                         int(n_rewards.sum()))
        return cls(
            np.fromiter((len(r.token_ids) for r in rows), np.int64, n),
            np.fromiter((r.start for r in rows), np.int64, n),
            np.fromiter((r.block_table is not None for r in rows), bool, n),
            n_rewards, at, np.repeat(np.arange(n), n_rewards),
        )


def check_rows(rows: Sequence[Any], a: RowArrays, *, max_model_len: int, window_note: str, vocab_size: int,
               kv_blocks: int | None, block_size: int | None, full: bool) -> None:
    """The checks of every row, vectorised; an error names the caller's row (a packed batch
    renumbers them). Always: lengths, context window, reward positions, tables long enough.
    With ``full`` (debug mode) also every token id and block id."""
    def first(bad: np.ndarray) -> int | None:
        return int(np.argmax(bad)) if bad.any() else None

    if (i := first(a.lens == 0)) is not None:
        raise ValueError(f"row {i} has no new tokens")
    if (i := first(a.starts < 0)) is not None:
        raise ValueError(f"row {i} has negative start {a.starts[i]}")
    ends = a.starts + a.lens
    if (i := first(ends > max_model_len)) is not None:
        raise ValueError(
            f"row {i} has {ends[i]} tokens (start {a.starts[i]} + {a.lens[i]} new), more than the PRM's "
            f"context window max_position_embeddings={max_model_len}{window_note}"
        )
    at, row_of = a.reward_at, a.reward_row
    if (k := first((at < 0) | (at >= a.lens[row_of]))) is not None:
        i = int(row_of[k])
        raise ValueError(f"row {i}: reward position {at[k]} outside its {a.lens[i]} new tokens")
    if full:
        for i, r in enumerate(rows):
            ids = np.asarray(r.token_ids)
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= vocab_size:
                raise ValueError(f"row {i}: token id {lo if lo < 0 else hi} outside the vocabulary [0, {vocab_size})")
    if (i := first(~a.cached & (a.starts > 0))) is not None:
        raise ValueError(f"row {i}: start={a.starts[i]} needs a block table (cached prefix)")
    if not a.cached.any():
        return
    if kv_blocks is None:
        i = int(np.argmax(a.cached))
        raise ValueError(f"row {i} has a block table but the PRM has no KV cache (allocate_kv_cache)")
    for i in np.flatnonzero(a.cached):
        table = rows[i].block_table
        needed = -(-int(ends[i]) // block_size)
        if len(table) < needed:
            raise ValueError(f"row {i}: block table has {len(table)} blocks but {ends[i]} tokens "
                             f"need {needed} blocks of {block_size}")
        if full and len(table):
            t = np.asarray(table)
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= kv_blocks:
                raise ValueError(f"row {i}: block id {lo if lo < 0 else hi} out of range [0, {kv_blocks})")


def pack(lens: Sequence[int], max_tokens: int) -> list[int]:
    """Greedy packing in input order under ``max_tokens`` new tokens (an over-long row runs
    alone): the index of each chunk's first row, and len(lens) at the end."""
    if not len(lens):
        return [0]
    bounds, tokens = [0], 0
    for i, n in enumerate(lens):
        if i and tokens + n <= max_tokens:
            tokens += n
        else:
            if i:
                bounds.append(i)
            tokens = n
    bounds.append(len(lens))
    return bounds


def build_chunks(rows: Sequence[Any], members: np.ndarray, a: RowArrays, *, max_tokens: int, block_size: int,
                 staging: HostStaging, cached: bool, ramp: np.ndarray, debug: bool = False) -> list[PRMChunk]:
    """The forwards of ``rows[members]`` (all of one kind, ``members`` ascending): packed,
    laid out flat, uploaded once, one ``PRMChunk`` of slices per forward. ``ramp``: 0, 1, ...
    past every row's end (positions are slices of it: one pass over the tokens, not three). Token ids and
    positions are int32 (the model reads either; half the bytes to write and copy). With
    ``debug``: no two new tokens of one forward write the same KV slot."""
    lens, starts, n_rew = a.lens[members], a.starts[members], a.n_rewards[members]
    part = [rows[i] for i in members]
    bounds = pack(lens.tolist(), max_tokens)
    first = np.asarray(bounds[:-1], dtype=np.int64)  # each chunk's first row
    sizes = np.diff(bounds)
    n = len(part)

    cu = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    ends = starts + lens
    # The two token-sized arrays (MBs for long paths) are laid out in reused host memory.
    kind = "cached" if cached else "whole"
    ids = np.concatenate([x for r in part for x in token_parts(r.token_ids)],
                         out=staging.scratch(f"prm_ids_{kind}", int(cu[-1]), np.int32))
    positions = np.concatenate([ramp[s:e] for s, e in zip(starts.tolist(), ends.tolist())],
                               out=staging.scratch(f"prm_positions_{kind}", int(cu[-1]), ramp.dtype))
    # Per chunk c: its rows' cu_seqlens from 0, i.e. cu[first[c] .. first[c] + sizes[c]] - cu[first[c]].
    at_row = np.repeat(first, sizes + 1)
    entries = np.arange(n + len(sizes)) - np.repeat(np.arange(len(sizes)), sizes + 1)
    local_cu = cu[entries] - cu[at_row]
    chunk_of_row = np.repeat(np.arange(len(sizes)), sizes)
    reward_index = None
    if n_rew.any():
        at = a.reward_at if n == len(rows) else a.reward_at[np.isin(a.reward_row, members)]
        row_off = cu[:-1] - cu[first[chunk_of_row]]  # each row's first token within its chunk
        reward_index = at + np.repeat(row_off, n_rew)
        rew_cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_rew, out=rew_cu[1:])
    table = slots = None
    if cached:
        tables = [np.asarray(r.block_table, dtype=np.int64).reshape(-1) for r in part]
        table = pad_tables(tables, np.fromiter((t.shape[0] for t in tables), np.int64, n))
        row_of_token = np.repeat(np.arange(n), lens)
        slots = slot_mapping(table, row_of_token, positions, block_size)
        if debug:
            for c, (t0, t1) in enumerate(zip(cu[bounds[:-1]].tolist(), cu[bounds[1:]].tolist())):
                if np.unique(slots[t0:t1]).size != t1 - t0:
                    raise ValueError(f"PRM forward {c}: two new tokens map to the same KV cache slot "
                                     "(rows share a block they both write)")

    staging.begin()
    ids_t = staging.put("prm_input_ids", ids, torch.int32)
    pos_t = staging.put("prm_positions", positions.astype(np.int32, copy=False), torch.int32)
    cu_t = staging.put("prm_cu_seqlens_q", local_cu.astype(np.int32), torch.int32)
    ctx_t = staging.put("prm_context_lens", ends.astype(np.int32), torch.int32)
    slots_t = staging.put("prm_slot_mapping", slots, torch.long) if cached else None
    table_t = staging.put("prm_block_tables", table.astype(np.int32), torch.int32) if cached else None
    rew_t = staging.put("prm_reward_index", reward_index, torch.long) if reward_index is not None else None
    staging.end()

    # Each tensor cut into its chunks' views with one split (a Python slice per chunk and
    # tensor cost ~5x as much at 86 chunks).
    tok_sizes, row_sizes = np.diff(cu[bounds]).tolist(), sizes.tolist()
    n_chunks = len(row_sizes)
    ids_c, pos_c = ids_t.split(tok_sizes), pos_t.split(tok_sizes)
    cu_c, ctx_c = cu_t.split((sizes + 1).tolist()), ctx_t.split(row_sizes)
    slots_c = slots_t.split(tok_sizes) if cached else (None,) * n_chunks
    table_c = table_t.split(row_sizes) if cached else (None,) * n_chunks
    if reward_index is not None:
        rew_sizes = np.diff(rew_cu[bounds]).tolist()
        rew_c = [r if k else None for r, k in zip(rew_t.split(rew_sizes), rew_sizes)]
    else:
        rew_c = (None,) * n_chunks
    # Row facts as tuples once: a chunk's slice of a tuple is its tuple (no per-chunk copy to one)
    lens_t, starts_t, members_l = tuple(lens.tolist()), tuple(starts.tolist()), members.tolist()
    chunks = []
    for c, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:])):
        batch = AttentionBatch(
            input_ids=ids_c[c],
            positions=pos_c[c],
            slot_mapping=slots_c[c],
            cu_seqlens_q=cu_c[c],
            context_lens=ctx_c[c],
            block_tables=table_c[c],
            query_lens=lens_t[r0:r1],
            start_positions=starts_t[r0:r1],
            block_size=block_size,
            host_block_tables=table[r0:r1] if cached else None,
        )
        chunks.append(PRMChunk(members_l[r0:r1], batch, rew_c[c], cached))
    return chunks
