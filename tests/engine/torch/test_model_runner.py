"""Our paged-cache forward equals transformers' own model on the same checkpoint:
prefill, step-by-step decode, mixed prefill/decode batches and forked rows,
for Qwen2 (q/k/v bias, tied embeddings) and Llama (llama3 RoPE scaling, sharded)."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.runtime.model_runner import ModelRunner

ARCHS = ["qwen2", "llama"]
DTYPES = [torch.float32, torch.float64]
CASES = [pytest.param(a, d, id=f"{a}-{str(d).removeprefix('torch.')}") for a in ARCHS for d in DTYPES]


def tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def runners(tiny):
    cache = {}

    def get(name, dtype, block_size=16, num_blocks=64):
        key = (name, dtype, block_size, num_blocks)
        if key not in cache:
            cache[key] = ModelRunner(tiny[name], dtype=dtype, block_size=block_size, num_blocks=num_blocks)
        return cache[key]

    return get


@pytest.mark.parametrize("name,dtype", CASES)
def test_prefill_two_rows(name, dtype, runners, ref_logits, assert_close_rel, block_pool):
    runner = runners(name, dtype)
    pool = block_pool(runner.num_blocks, seed=1)
    seqs = [tokens(37, 1), tokens(20, 2)]
    rows = [BatchRow(s, 0, pool.grow([], len(s), runner.block_size)) for s in seqs]
    batch = runner.make_batch(rows)
    hidden = runner.forward(batch)
    all_logits = runner.model.compute_logits(hidden)
    cu = batch.cu_seqlens_q.tolist()
    for r, s in enumerate(seqs):
        ref = ref_logits(name, dtype, s)
        assert_close_rel(all_logits[cu[r] : cu[r + 1]], ref, dtype, f"prefill row {r}")
    last = runner.compute_logits(hidden, batch)
    assert last.shape == (2, runner.config.vocab_size)
    for r, s in enumerate(seqs):
        assert_close_rel(last[r], ref_logits(name, dtype, s)[-1], dtype, f"last logits row {r}")
    only_second = runner.compute_logits(hidden, batch, [1])
    assert only_second.shape == (1, runner.config.vocab_size)
    assert_close_rel(only_second[0], last[1], dtype, "row subset")


@pytest.mark.parametrize("name,dtype", CASES)
def test_decode_step_by_step(name, dtype, runners, ref_logits, assert_close_rel, block_pool):
    """Two rows decode together through small blocks (size 4), tables growing as they go."""
    runner = runners(name, dtype, block_size=4, num_blocks=64)
    pool = block_pool(runner.num_blocks, seed=2)
    seqs = [tokens(30, 3), tokens(23, 4)]
    refs = [ref_logits(name, dtype, s) for s in seqs]
    prompt = [5, 3]
    tables = [pool.grow([], p, 4) for p in prompt]
    batch = runner.make_batch([BatchRow(s[:p], 0, t) for s, p, t in zip(seqs, prompt, tables)])
    logits = runner.compute_logits(runner.forward(batch), batch)
    for r in range(2):
        assert_close_rel(logits[r], refs[r][prompt[r] - 1], dtype, f"prompt row {r}")
    lengths = list(prompt)
    while any(n < len(s) for n, s in zip(lengths, seqs)):
        live = [r for r in range(2) if lengths[r] < len(seqs[r])]
        rows = []
        for r in live:
            pool.grow(tables[r], lengths[r] + 1, 4)
            rows.append(BatchRow([seqs[r][lengths[r]]], lengths[r], tables[r]))
        batch = runner.make_batch(rows)
        logits = runner.compute_logits(runner.forward(batch), batch)
        for i, r in enumerate(live):
            assert_close_rel(logits[i], refs[r][lengths[r]], dtype, f"decode row {r} pos {lengths[r]}")
            lengths[r] += 1


@pytest.mark.parametrize("name,dtype", CASES)
def test_mixed_prefill_chunk_and_decode(name, dtype, runners, ref_logits, assert_close_rel, block_pool):
    """One forward: row A prefills a chunk over its cached prefix, row B decodes,
    row C prefills from scratch."""
    runner = runners(name, dtype, block_size=8, num_blocks=64)
    pool = block_pool(runner.num_blocks, seed=3)
    a, b, c = tokens(31, 5), tokens(13, 6), tokens(9, 7)
    ta, tb = pool.grow([], 31, 8), pool.grow([], 13, 8)
    runner.forward(runner.make_batch([BatchRow(a[:10], 0, ta), BatchRow(b[:12], 0, tb)]))
    tc = pool.grow([], 9, 8)
    rows = [BatchRow(a[10:], 10, ta), BatchRow(b[12:], 12, tb), BatchRow(c, 0, tc)]
    batch = runner.make_batch(rows)
    hidden = runner.forward(batch)
    all_logits = runner.model.compute_logits(hidden)
    cu = batch.cu_seqlens_q.tolist()
    for r, (seq, start) in enumerate([(a, 10), (b, 12), (c, 0)]):
        ref = ref_logits(name, dtype, seq)[start:]
        assert_close_rel(all_logits[cu[r] : cu[r + 1]], ref, dtype, f"mixed row {r}")


@pytest.mark.parametrize("name,dtype", CASES)
def test_fork_shared_prefix(name, dtype, runners, ref_logits, assert_close_rel, block_pool):
    """Two children share the full blocks of a 22-token prefix; the partial last
    block is copied (copy-on-write) and the children decode diverging tokens."""
    bs = 8
    runner = runners(name, dtype, block_size=bs, num_blocks=64)
    pool = block_pool(runner.num_blocks, seed=4)
    prefix = tokens(22, 8)
    parent = pool.grow([], len(prefix), bs)  # 2 full blocks + 1 partial (6 tokens)
    runner.forward(runner.make_batch([BatchRow(prefix, 0, parent)]))
    shared_before = runner.kv_cache.kv[:, :, parent[:2]].clone()

    copy = pool.take()
    runner.copy_block(parent[2], copy)
    children = [list(parent), parent[:2] + [copy]]
    tails = [tokens(12, 9), tokens(12, 10)]
    refs = [ref_logits(name, dtype, prefix + t) for t in tails]
    for step in range(12):
        pos = len(prefix) + step
        rows = [BatchRow([tails[c][step]], pos, pool.grow(children[c], pos + 1, bs)) for c in range(2)]
        batch = runner.make_batch(rows)
        logits = runner.compute_logits(runner.forward(batch), batch)
        for c in range(2):
            assert_close_rel(logits[c], refs[c][pos], dtype, f"child {c} pos {pos}")
    # The shared full blocks were only read, never written.
    assert torch.equal(runner.kv_cache.kv[:, :, parent[:2]], shared_before)


def test_rows_are_batch_invariant_in_float64(runners, block_pool):
    """A row's logits do not depend on what else is in the batch (the paired-sampling
    equivalence of the design relies on this in float64)."""
    runner = runners("llama", torch.float64, block_size=8, num_blocks=64)
    pool = block_pool(runner.num_blocks, seed=5)
    seq, other = tokens(17, 11), tokens(25, 12)
    t1 = pool.grow([], 17, 8)
    alone = runner.make_batch([BatchRow(seq, 0, t1)])
    logits_alone = runner.compute_logits(runner.forward(alone), alone)[0]
    t2, t3 = pool.grow([], 17, 8), pool.grow([], 25, 8)
    mixed = runner.make_batch([BatchRow(other, 0, t3), BatchRow(seq, 0, t2)])
    logits_mixed = runner.compute_logits(runner.forward(mixed), mixed, [1])[0]
    assert (logits_alone - logits_mixed).abs().max().item() <= 1e-12


def test_bfloat16_runs_close_to_float32(tiny, ref_logits, block_pool):
    runner = ModelRunner(tiny["qwen2"], dtype="bfloat16", num_blocks=8)
    seq = tokens(20, 13)
    batch = runner.make_batch([BatchRow(seq, 0, [3, 1])])
    logits = runner.compute_logits(runner.forward(batch), batch)
    assert runner.kv_cache.dtype == torch.bfloat16 and logits.dtype == torch.float32
    ref = ref_logits("qwen2", torch.float32, seq)[-1]
    assert ((logits[0] - ref).abs().max() / ref.abs().max()).item() < 0.05


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ARCHS)
def test_cuda_matches_cpu(name, tiny, block_pool):
    seqs = [tokens(29, 14), tokens(7, 15)]
    out = {}
    for device in ("cpu", "cuda"):
        runner = ModelRunner(tiny[name], dtype=torch.float32, device=device, block_size=8, num_blocks=32)
        pool = block_pool(32, seed=6)
        tables = [pool.grow([], 40, 8) for _ in seqs]
        runner.forward(runner.make_batch([BatchRow(seqs[0][:20], 0, tables[0])]))
        batch = runner.make_batch([BatchRow(seqs[0][20:], 20, tables[0]), BatchRow(seqs[1], 0, tables[1])])
        out[device] = runner.compute_logits(runner.forward(batch), batch).cpu()
    assert ((out["cuda"] - out["cpu"]).abs().max() / out["cpu"].abs().max()).item() < 1e-4
