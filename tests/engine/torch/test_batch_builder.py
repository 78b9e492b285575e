"""BatchBuilder: per-iteration batches from the scheduler's sequences.

The block-table mirrors must follow every way the scheduler changes a table (append,
copy-on-write of the last block, preemption, a new list), and the batch must equal the
one the explicit ``AttentionBatch.from_rows`` builds from the same rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specscale.engine.backend import GenBatch, GenRow
from specscale.engine.sequence import PhysicalSequence
from specscale.engine.torch.attention.batch import AttentionBatch, BatchRow, BatchBuilder, tables_of, table_of

BS = 4


def seq(sid, tokens, blocks, cached):
    return PhysicalSequence(sid=sid, request_id=0, admit_order=sid, tokens=list(tokens), hist_hash=0,
                            num_cached=cached, blocks=list(blocks))


def same_batch(a: AttentionBatch, b: AttentionBatch) -> None:
    for name in ("input_ids", "positions", "slot_mapping", "cu_seqlens_q", "context_lens", "block_tables"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert a.query_lens == b.query_lens and a.start_positions == b.start_positions


def build_both(builder, seqs, n_new):
    rows = [GenRow(s, s.num_cached, n, True) for s, n in zip(seqs, n_new)]
    got = builder.gen_batch(GenBatch(rows))
    want = AttentionBatch.from_rows(
        [BatchRow(s.tokens[s.num_cached: s.num_cached + n], s.num_cached, s.blocks) for s, n in zip(seqs, n_new)],
        block_size=BS,
    )
    return got, want


@pytest.mark.parametrize("debug", [False, True])
def test_mirrors_follow_every_table_change(debug):
    builder = BatchBuilder(BS, torch.device("cpu"), debug_checks=debug)
    a = seq(0, range(10, 17), [3, 5], 6)  # decode at position 6 (block 5)
    b = seq(1, range(20, 29), [8, 1, 2], 8)  # decode at position 8 (block 2)
    c = seq(2, range(30, 33), [9], 0)  # a prefill of 3 tokens
    for step in range(6):
        got, want = build_both(builder, [a, b, c], [len(s.tokens) - s.num_cached for s in (a, b, c)])
        same_batch(got, want)
        for s in (a, b, c):  # the forward ran: every token is cached, one more is drawn
            s.num_cached = len(s.tokens)
            s.tokens.append(40 + step)
        if step == 0:
            a.blocks.append(7)  # a crosses into a new block
        if step == 1:
            b.blocks[-1] = 11  # copy-on-write of b's shared partial last block
        if step == 2:  # preemption of a: the same list cleared, refilled with the same last block
            last = a.blocks[-1]
            a.blocks.clear()
            a.preemptions += 1
            a.blocks.extend([12, 13][: -(-len(a.tokens) // BS) - 1] + [last])
            assert len(a.blocks) == len(a.table_mirror.view)  # only the preemption count tells
            a.num_cached = 0
        if step == 3:
            c.blocks = [15, 6]  # a new list (re-attached prefix)
        if step == 4:
            b.blocks[-1] = 16  # copy-on-write and a new block in one iteration
            b.blocks.append(17)
        for s in (a, b, c):
            while len(s.blocks) * BS < len(s.tokens):
                s.blocks.append(100 + len(s.blocks) + 10 * s.sid)


def test_stale_mirror_is_caught_in_debug_mode():
    s = seq(0, range(8), [1, 2], 7)
    table_of(s)
    s.blocks[0] = 9  # a change the scheduler never makes (not the last block)
    assert tables_of([s])[0][0].tolist() == [1, 2]  # serving trusts the invariant
    with pytest.raises(AssertionError, match="mirror out of date"):
        table_of(s, debug=True)


def test_rows_of_different_widths_pad_with_minus_one():
    builder = BatchBuilder(BS, torch.device("cpu"))
    seqs = [seq(0, range(9), [4, 5, 6], 8), seq(1, range(2), [7], 1)]
    got, want = build_both(builder, seqs, [1, 1])
    same_batch(got, want)
    assert got.block_tables.tolist() == [[4, 5, 6], [7, -1, -1]]
    assert got.slot_mapping.tolist() == [6 * BS + 0, 7 * BS + 1]


def test_debug_checks_govern_the_per_token_checks():
    rows = [BatchRow([3, 99], 0, [0])]
    quiet = BatchBuilder(BS, torch.device("cpu"), vocab_size=50, num_blocks=4, debug_checks=False)
    assert quiet.from_rows(rows).input_ids.tolist() == [3, 99]
    checked = BatchBuilder(BS, torch.device("cpu"), vocab_size=50, num_blocks=4, debug_checks=True)
    with pytest.raises(ValueError, match="token id 99 outside the vocabulary"):
        checked.from_rows(rows)
    with pytest.raises(ValueError, match="block id 9 out of range"):
        checked.from_rows([BatchRow([1], 0, [9])])
    with pytest.raises(ValueError, match="same KV cache slot"):
        checked.from_rows([BatchRow([1], 0, [2]), BatchRow([2], 0, [2])])
    # The O(rows) checks run whatever the mode.
    with pytest.raises(ValueError, match="need 2 blocks"):
        quiet.from_rows([BatchRow([1, 2, 3, 4, 5], 0, [0])])


def test_runner_debug_mode_defaults_to_the_environment(monkeypatch):
    from specscale.engine.torch.attention.batch import debug_checks_default

    monkeypatch.setenv("SPECSCALE_DEBUG_CHECKS", "1")
    assert debug_checks_default()
    monkeypatch.setenv("SPECSCALE_DEBUG_CHECKS", "0")
    assert not debug_checks_default()
