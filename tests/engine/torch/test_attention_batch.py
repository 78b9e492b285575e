"""AttentionBatch metadata for a mixed decode/prefill batch."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.attention.backends import AttentionBackend, TorchAttentionBackend, decode_additive_mask
from specscale.engine.torch.attention.select import make_attention_backend
from specscale.engine.torch.attention.batch import AttentionBatch, BatchRow


def test_fields_of_a_mixed_batch():
    rows = [
        BatchRow([11], start=5, block_table=[7, 2]),  # decode at position 5 (block 2)
        BatchRow([21, 22, 23], start=2, block_table=[4, 1]),  # prefill chunk over 2 cached tokens
        BatchRow([31, 32], start=0, block_table=[9]),
    ]
    b = AttentionBatch.from_rows(rows, block_size=4)
    assert b.input_ids.tolist() == [11, 21, 22, 23, 31, 32]
    assert b.positions.tolist() == [5, 2, 3, 4, 0, 1]
    assert b.num_rows == 3 and b.num_tokens == 6 and b.uses_kv_cache
    assert b.cu_seqlens_q.tolist() == [0, 1, 4, 6]
    assert b.context_lens.tolist() == [6, 5, 2]
    assert b.query_lens == (1, 3, 2) and b.start_positions == (5, 2, 0)
    assert b.block_tables.tolist() == [[7, 2], [4, 1], [9, -1]]
    assert b.block_tables.dtype == torch.int32 and b.cu_seqlens_q.dtype == torch.int32
    assert b.max_query_len == 3 and b.max_context_len == 6
    assert b.last_token_indices().tolist() == [0, 3, 5]
    assert b.last_token_indices([2, 0]).tolist() == [5, 0]
    with pytest.raises(IndexError):
        b.last_token_indices([3])


def test_slot_mapping():
    rows = [BatchRow([1], start=5, block_table=[7, 2]), BatchRow([2, 3, 4, 5], start=2, block_table=[4, 8])]
    b = AttentionBatch.from_rows(rows, block_size=4)
    assert b.slot_mapping.tolist() == [2 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 8 * 4 + 0, 8 * 4 + 1]


def test_row_validation():
    with pytest.raises(ValueError, match="block table has 1 blocks but 5 tokens need 2"):
        AttentionBatch.from_rows([BatchRow([2, 3, 4], start=2, block_table=[4])], block_size=4)
    with pytest.raises(ValueError, match="either every row has a block table or none"):
        AttentionBatch.from_rows([BatchRow([1], 0, [0]), BatchRow([1])])
    with pytest.raises(ValueError, match="negative block id"):
        AttentionBatch.from_rows([BatchRow([1], 0, [-1])])


def test_no_cache_batch():
    b = AttentionBatch.from_rows([BatchRow([1, 2, 3]), BatchRow([4])])
    assert not b.uses_kv_cache and b.slot_mapping is None and b.block_tables is None
    assert b.positions.tolist() == [0, 1, 2, 0]


def test_plan_groups_decode_and_prefill_rows_separately():
    rows = [BatchRow([1], 40, [0, 1, 2]), BatchRow(list(range(30)), 0, [3, 4]), BatchRow([2], 3, [5]),
            BatchRow(list(range(5)), 20, [6, 7])]
    plan = TorchAttentionBackend().plan(AttentionBatch.from_rows(rows))
    shapes = [(g.rows, g.q_len, g.k_len) for g in plan.groups]
    assert shapes == [(2, 1, 41), (1, 5, 25)]  # decode rows; the chunk over a cached prefix
    assert plan.fresh_spans == ((1, 30),)  # the prompt with nothing cached: causal over itself


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_decode_mask_cut_from_lengths_equals_the_compared_mask(dtype):
    ctx = torch.tensor([1, 17, 48, 30, 48, 2], dtype=torch.int32)
    n_keys = 48
    want = torch.where(torch.arange(n_keys)[None, :] < ctx[:, None], 0.0, float("-inf")).to(dtype)
    got = decode_additive_mask(ctx.numpy(), n_keys, dtype)
    assert got.shape == (6, 1, 1, n_keys) and got.dtype == dtype
    assert torch.equal(got[:, 0, 0], want)
    # the plan's decode group hands SDPA exactly this mask, and the bool form agrees with it
    rows = [BatchRow([1], int(c) - 1, list(range(3 * i, 3 * i + 3))) for i, c in enumerate(ctx)]
    grp = TorchAttentionBackend().plan(AttentionBatch.from_rows(rows)).groups[0]
    assert grp.mask is None and torch.equal(grp.additive_mask(dtype)[:, 0, 0], want)
    assert torch.equal(grp.additive_mask(torch.bfloat16)[:, 0, 0], want.to(torch.bfloat16))


def test_no_cache_attention_is_causal_per_row():
    """Each row of a no-cache batch equals plain causal attention over that row alone."""
    torch.manual_seed(0)
    lens = [5, 1, 3]
    b = AttentionBatch.from_rows([BatchRow([0] * n) for n in lens], device="cpu")
    q = torch.randn(sum(lens), 4, 8, dtype=torch.float64)
    k = torch.randn(sum(lens), 2, 8, dtype=torch.float64)
    v = torch.randn(sum(lens), 2, 8, dtype=torch.float64)
    backend = TorchAttentionBackend()
    out = backend.forward(q, k, v, None, backend.plan(b), scale=0.3)
    start = 0
    for n in lens:
        qs, ks, vs = q[start : start + n], k[start : start + n], v[start : start + n]
        ks, vs = ks.repeat_interleave(2, dim=1), vs.repeat_interleave(2, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * 0.3
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        expect = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs)
        assert torch.allclose(out[start : start + n], expect, atol=1e-12)
        start += n


def test_backend_interface():
    assert isinstance(make_attention_backend("torch"), AttentionBackend)
    with pytest.raises(ValueError, match="unknown attention backend 'flashinfer'"):
        make_attention_backend("flashinfer")
    with pytest.raises(TypeError):
        AttentionBackend()
