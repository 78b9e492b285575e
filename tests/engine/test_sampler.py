"""The paired sampler and computation deduplication's sampling semantics."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specscale.hashing import child_key, paired_uniforms, root_key
from specscale.engine.sampler import SamplingParams, filtered_cdf, sample_rows

P = SamplingParams(temperature=0.8, top_p=1.0)


def _logits(v=12, rows=3, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(rows, v)) * 2.0)


def test_same_logits_same_token_whatever_the_batch():
    logits = _logits(rows=4)
    keys = np.array([root_key(0, i) for i in range(4)], dtype=np.uint64)
    idx = np.array([0, 3, 7, 1], dtype=np.uint64)
    together = sample_rows(logits, np.arange(4), keys, idx, P)
    for i in range(4):  # each alone, in a batch of one, at another row index
        alone = sample_rows(logits[[i, i]], np.array([1]), keys[i: i + 1], idx[i: i + 1], P)
        assert alone[0] == together[i]


def test_dedup_draws_equal_independent_rows():
    """m members reading one shared row draw what m duplicated rows would give."""
    row = _logits(rows=1)
    m = 64
    keys = np.array([child_key(root_key(1, 0), j) for j in range(m)], dtype=np.uint64)
    idx = np.zeros(m, dtype=np.uint64)
    shared = sample_rows(row, np.zeros(m, dtype=np.int64), keys, idx, P)
    duplicated = sample_rows(row.repeat(m, 1), np.arange(m), keys, idx, P)
    assert (shared == duplicated).all()


def test_cd_counts_match_the_distribution_chi_square():
    """Counts drawn by m members of one physical row follow Multinomial(m, p)."""
    row = torch.log(torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.06, 0.04]], dtype=torch.float64)) * P.temperature
    p = torch.softmax(row[0] / P.temperature, -1).numpy()
    m = 20000
    keys = np.array([child_key(root_key(3, 0), j) for j in range(m)], dtype=np.uint64)
    tokens = sample_rows(row, np.zeros(m, dtype=np.int64), keys, np.full(m, 5, dtype=np.uint64), P)
    counts = np.bincount(tokens, minlength=6)
    assert chisquare(counts, p * m).pvalue > 1e-3
    # Independence across members: pairs of consecutive members agree as often as sum p^2 says.
    agree = (tokens[0::2] == tokens[1::2]).mean()
    assert agree == pytest.approx((p * p).sum(), abs=0.02)


def test_uniforms_are_uniform_and_keyed():
    keys = np.array([root_key(5, i) for i in range(50000)], dtype=np.uint64)
    u = paired_uniforms(keys, np.zeros(len(keys), dtype=np.uint64))
    assert 0.0 <= u.min() and u.max() < 1.0
    hist, _ = np.histogram(u, bins=20, range=(0, 1))
    assert chisquare(hist).pvalue > 1e-3
    assert not np.array_equal(u, paired_uniforms(keys, np.ones(len(keys), dtype=np.uint64)))


def test_top_p_keeps_the_nucleus_in_token_order():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1]], dtype=torch.float64)
    cdf = filtered_cdf(torch.log(probs), SamplingParams(1.0, 0.75))
    kept = torch.diff(cdf[0], prepend=torch.zeros(1, dtype=torch.float64))
    assert torch.allclose(kept, torch.tensor([0.0, 0.5, 0.3, 0.0], dtype=torch.float64))
    keys = np.array([root_key(0, i) for i in range(2000)], dtype=np.uint64)
    toks = sample_rows(torch.log(probs), np.zeros(2000, dtype=np.int64), keys, np.zeros(2000, dtype=np.uint64),
                       SamplingParams(1.0, 0.75))
    assert set(np.unique(toks)) == {1, 2}


def test_greedy_and_bad_params():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    assert sample_rows(logits, np.array([0]), np.array([1], dtype=np.uint64), np.array([0], dtype=np.uint64),
                       SamplingParams(0.0, 1.0))[0] == 1
    with pytest.raises(ValueError):
        SamplingParams(0.8, 0.0)
    with pytest.raises(ValueError):
        SamplingParams(-1.0, 1.0)


def test_vectorised_history_roll_equals_the_scalar_one():
    """The engine rolls every drawn token into its history hash at once (roll_np): the same
    64-bit hashes as the scalar roll, including hashes with the top bit set."""
    from specscale.hashing import roll, roll_np

    rng = np.random.default_rng(0)
    hashes = [int(x) for x in rng.integers(0, 2**63, 500, dtype=np.uint64)] + [2**64 - 1, 2**63, 0]
    hashes = [h | (1 << 63) if i % 2 else h for i, h in enumerate(hashes)]
    tokens = [int(t) for t in rng.integers(0, 200_000, len(hashes))]
    got = roll_np(np.fromiter(hashes, dtype=np.uint64, count=len(hashes)), np.asarray(tokens, dtype=np.uint64))
    assert got.tolist() == [roll(h, t) for h, t in zip(hashes, tokens)]
