"""The flat PRM batch (prm_batch.py): each forward's slices hold exactly what a batch built
for that forward alone holds, and the rows PRMPaths gives (token runs, whole-path slices)
are the whole paths token for token."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from specscale.engine.backend import ScoreItem
from specscale.engine.torch.attention.batch import BatchRow, BatchBuilder, HostStaging
from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.torch.prm.batch import RowArrays, build_chunks, pack
from specscale.engine.text.prm_rows import TokenRun
from specscale.engine.text.prm_paths import PRMPaths

BS = 4


def random_rows(rng, n, cached, max_len=40):
    rows, next_block = [], 0
    for _ in range(n):
        new = int(rng.integers(1, max_len))
        start = int(rng.integers(0, 30)) if cached else 0
        table = None
        if cached:
            k = -(-(start + new) // BS) + int(rng.integers(0, 3))  # some tables longer than needed
            table = list(range(next_block, next_block + k))
            next_block += k
        ids = rng.integers(0, 500, new)
        parts = (ids,) if new < 3 else (ids[:2], ids[2:])
        rew = sorted(rng.choice(new, size=int(rng.integers(0, min(new, 4) + 1)), replace=False).tolist())
        rows.append(PRMRow(TokenRun(parts) if rng.random() < 0.5 else ids.tolist(), start, table, rew))
    return rows


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("max_tokens", [1, 25, 60, 10_000])
@pytest.mark.parametrize("every", [1, 3])
def test_chunks_equal_batches_built_alone(cached, max_tokens, every):
    """every: the forwards of every row, or of every third (the rows of one kind in a mixed call)."""
    rng = np.random.default_rng(7 + max_tokens + cached)
    rows = random_rows(rng, 23, cached)
    facts = RowArrays.of(rows)
    members = np.arange(0, len(rows), every)
    chunks = build_chunks(rows, members, facts, max_tokens=max_tokens, block_size=BS,
                          staging=HostStaging(torch.device("cpu")), cached=cached, ramp=np.arange(200, dtype=np.int32))
    bounds = pack([len(rows[i].token_ids) for i in members], max_tokens)
    assert [c.members for c in chunks] == [members[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]
    builder = BatchBuilder(BS, torch.device("cpu"), debug_checks=True)
    for chunk in chunks:
        part = [rows[i] for i in chunk.members]
        alone = builder.from_rows([BatchRow(list(r.token_ids), r.start, r.block_table) for r in part])
        got = chunk.batch
        for name in ("input_ids", "positions", "cu_seqlens_q", "context_lens"):
            assert torch.equal(getattr(got, name).long(), getattr(alone, name).long()), name
        assert got.query_lens == alone.query_lens and got.start_positions == alone.start_positions
        if cached:
            assert torch.equal(got.slot_mapping, alone.slot_mapping)
            w = alone.block_tables.shape[1]
            assert torch.equal(got.block_tables[:, :w], alone.block_tables)
            assert (got.block_tables[:, w:] == -1).all()
        else:
            assert got.slot_mapping is None and got.block_tables is None
        want, off = [], 0
        for r in part:
            want += [off + p for p in r.reward_positions]
            off += len(r.token_ids)
        if want:
            assert chunk.reward_index.tolist() == want
        else:
            assert chunk.reward_index is None


def test_pack_is_greedy_in_order():
    assert pack([3, 3, 3, 9, 1], 6) == [0, 2, 3, 4, 5]  # the 9-token row runs alone
    assert pack([5], 1) == [0, 1]
    assert pack([], 4) == [0]


def test_token_run_reads_as_its_tokens():
    run = TokenRun([np.array([1, 2], dtype=np.int32), np.array([], dtype=np.int32), np.array([3])])
    assert len(run) == 3 and list(run) == [1, 2, 3] and run[1] == 2 and run == [1, 2, 3]
    assert np.asarray(run).tolist() == [1, 2, 3] and np.asarray(run, dtype=np.int64).dtype == np.int64
    assert TokenRun([np.array([4, 5])], 2).joined().tolist() == [4, 5]


# ---------------------------------------------------------------- PRMPaths rows
@dataclass(eq=False)
class Cand:
    cid: int
    request_id: int
    round: int
    parent: Any
    step: list[int] = field(default_factory=list)


HEAD = [7, 8, 9]
CLOSE = (90, 91)


def chain(depth, request_id=0, start_cid=1):
    node = Cand(0, request_id, -1, None)
    nodes = [node]
    for r in range(depth):
        node = Cand(start_cid + r, request_id, r, node, [10 * (r + 1) + i for i in range(r + 2)])
        nodes.append(node)
    return nodes


def whole(nodes, upto):
    ids, rew = list(HEAD), []
    for n in nodes[1: upto + 1]:
        ids += n.step + [99]
        rew.append(len(ids) - 1)
    return ids, rew


def make_paths():
    return PRMPaths(lambda rid: HEAD, lambda c: ((*c.step, 99), len(c.step)), CLOSE, vocab_size=100)


@pytest.mark.parametrize("built_first", [False, True])
def test_rows_are_the_paths_after_the_cached_prefix(built_first):
    nodes = chain(5)
    paths = make_paths()
    if built_first:  # the leaf's own path already built (a child asked for it)
        paths.piece(nodes[5]).path()
    leaf = nodes[5]
    ids, rew = whole(nodes, 5)
    # no cache: the whole path and the closing tokens
    row = paths.row(ScoreItem(leaf, len(ids) + 2, 0))
    assert list(row.token_ids) == ids + list(CLOSE) and list(row.reward_positions) == rew
    # cached through step 3: only steps 4-5 and the closing tokens
    n_cached = paths.prefix_len(nodes[3])
    row = paths.row(ScoreItem(leaf, len(ids) + 2 - n_cached, n_cached, list(range(20)), cached_from=nodes[3]))
    assert list(row.token_ids) == ids[n_cached:] + list(CLOSE)
    assert list(row.reward_positions) == [p - n_cached for p in rew[3:]]
    # cached through its parent: its own piece only
    n_cached = paths.prefix_len(nodes[4])
    row = paths.row(ScoreItem(leaf, len(ids) + 2 - n_cached, n_cached, list(range(20)), cached_from=nodes[4]))
    assert list(row.token_ids) == ids[n_cached:] + list(CLOSE) and list(row.reward_positions) == [rew[4] - n_cached]
    # the head wave: the head only, no rewards
    row = paths.row(ScoreItem(nodes[0], len(HEAD), 0, list(range(2)), prefix_only=True))
    assert list(row.token_ids) == HEAD and len(row.reward_positions) == 0


def test_row_plan_mismatches_are_errors():
    nodes = chain(3)
    paths = make_paths()
    ids, _ = whole(nodes, 3)
    with pytest.raises(RuntimeError, match="counted 5 new tokens"):
        paths.row(ScoreItem(nodes[3], 5, 0))
    with pytest.raises(RuntimeError, match="reads 4 cached tokens, but its cached ancestor's prefix holds"):
        paths.row(ScoreItem(nodes[3], len(ids) - 2, 4, list(range(20)), cached_from=nodes[1]))


def test_path_rewards_chain_over_cached_prefixes():
    nodes = chain(3)
    paths = make_paths()
    ids, _ = whole(nodes, 3)
    assert paths.path_rewards(ScoreItem(nodes[2], 0, 0), [0.5, 0.25]) == [0.5, 0.25]
    n_cached = paths.prefix_len(nodes[2])
    it = ScoreItem(nodes[3], len(ids) + 2 - n_cached, n_cached, [0], cached_from=nodes[2])
    assert paths.path_rewards(it, [0.75]) == [0.5, 0.25, 0.75]
    # a new candidate with the same texts (same digests) keeps the first rewards computed
    twin = chain(3, start_cid=50)
    assert paths.path_rewards(ScoreItem(twin[3], 0, 0), [0.1, 0.2, 0.3]) == [0.5, 0.25, 0.75]
    other = chain(2, request_id=0, start_cid=80)
    other[2].step = [1, 2, 3]
    with pytest.raises(RuntimeError, match="its prefix is cached but its rewards are unknown"):
        paths.path_rewards(ScoreItem(Cand(90, 0, 3, other[2], [5]), 0, 0), [0.9])


def test_debug_mode_catches_two_rows_writing_one_slot():
    rows = [PRMRow([1, 2], 0, [0], [1]), PRMRow([3], 1, [0], [0])]  # both write block 0, slot 1
    kw = dict(max_tokens=100, block_size=BS, staging=HostStaging(torch.device("cpu")), cached=True,
              ramp=np.arange(10, dtype=np.int32))
    build_chunks(rows, np.arange(2), RowArrays.of(rows), **kw)  # not checked as served
    with pytest.raises(ValueError, match="two new tokens map to the same KV cache slot"):
        build_chunks(rows, np.arange(2), RowArrays.of(rows), debug=True, **kw)


@pytest.mark.parametrize("bad", [-1, 100, 2**40])
def test_piece_ids_outside_the_vocabulary_are_refused_where_the_piece_is_made(bad):
    nodes = chain(2)
    nodes[2].step = [11, bad, 12]
    paths = make_paths()
    assert paths.prefix_len(nodes[1]) == len(HEAD) + 3  # its parent is fine
    with pytest.raises(ValueError, match=f"candidate 2: its PRM piece: token id {bad} outside the PRM vocabulary"):
        paths.prefix_len(nodes[2])


@pytest.mark.parametrize("kind", ["list", "int32", "int64"])
def test_piece_ids_of_every_kind_are_checked_never_wrapped(kind):
    """Ids given as an int32 array are taken as they are; a wider array is checked in its
    own width first (an int64 id of 2**32 + 5 must not pass as 5 once narrowed)."""
    nodes = chain(1)
    paths = PRMPaths(lambda rid: HEAD, lambda c: (c.step, 0), CLOSE, vocab_size=100)
    make = {"list": list, "int32": lambda v: np.array(v, dtype=np.int32), "int64": lambda v: np.array(v, np.int64)}
    nodes[1].step = make[kind]([5, 6])
    piece = paths.piece(nodes[1])
    assert piece.ids.dtype == np.int32 and piece.ids.tolist() == [5, 6] and piece.rewards_at == (len(HEAD),)
    bad = chain(1, start_cid=7)
    bad[1].step = make[kind]([5, -3] if kind == "int32" else [5, 2**32 + 5])
    with pytest.raises(ValueError, match="candidate 7: its PRM piece: token id .* outside the PRM vocabulary"):
        paths.piece(bad[1])


def test_both_kinds_of_one_call_keep_their_own_inputs_in_reused_memory():
    """One staging lays out the whole-path rows and then the cached rows of a call (as
    ``prepare_rows`` does): the second layout must not overwrite the first's inputs, and
    the next call reuses the memory instead of taking fresh arrays."""
    rng = np.random.default_rng(11)
    staging, ramp = HostStaging(torch.device("cpu")), np.arange(200, dtype=np.int32)
    builder = BatchBuilder(BS, torch.device("cpu"), debug_checks=True)

    def lay_out():
        out = []
        for cached in (False, True):
            rows = random_rows(rng, 9, cached)
            out += [(rows, c) for c in build_chunks(rows, np.arange(9), RowArrays.of(rows), max_tokens=10_000,
                                                      block_size=BS, staging=staging, cached=cached, ramp=ramp)]
        return out

    first = lay_out()
    for rows, chunk in first:
        alone = builder.from_rows([BatchRow(list(r.token_ids), r.start, r.block_table) for r in rows])
        assert torch.equal(chunk.batch.input_ids.long(), alone.input_ids)
        assert torch.equal(chunk.batch.positions.long(), alone.positions)
    pointers = {c.batch.input_ids.data_ptr() for _, c in first}
    assert len(pointers) == 2  # one array per kind
    assert {c.batch.input_ids.data_ptr() for _, c in lay_out()} == pointers  # reused, not fresh
