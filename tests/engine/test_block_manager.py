"""KV blocks: reference counts, forks with copy-on-write, frees."""
from __future__ import annotations

import pytest

from specscale.engine.block_manager import BlockManager, OutOfBlocks


def test_fork_shares_blocks_and_copies_the_partial_one_on_write():
    bm = BlockManager(num_blocks=10, block_size=4)
    parent: list[int] = []
    bm.append(parent, 0, 6)  # 6 tokens -> 2 blocks, the second partial
    assert len(parent) == 2 and bm.num_used == 2
    child = bm.fork(parent, 6)
    assert child == parent and all(bm.refcount[b] == 2 for b in parent)
    assert bm.blocks_needed(child, 6, 1) == 1  # copy-on-write of the shared partial block
    copies = bm.append(child, 6, 1)
    assert copies == [(parent[1], child[1])] and child[0] == parent[0] and child[1] != parent[1]
    assert bm.refcount[parent[0]] == 2 and bm.refcount[parent[1]] == 1
    bm.free(child)
    bm.free(parent)
    assert bm.num_used == 0 and bm.num_free == 10 and bm.peak_used == 3


def test_full_blocks_need_no_copy():
    bm = BlockManager(num_blocks=4, block_size=4)
    t: list[int] = []
    bm.append(t, 0, 8)
    child = bm.fork(t, 8)
    assert bm.blocks_needed(child, 8, 1) == 1  # a new block, no copy
    assert bm.append(child, 8, 1) == []


def test_exhaustion_and_double_free():
    bm = BlockManager(num_blocks=2, block_size=2)
    t: list[int] = []
    with pytest.raises(OutOfBlocks):
        bm.append(t, 0, 5)
    bm.free(t)
    u = [0]
    with pytest.raises(RuntimeError):
        bm.free(u)
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0)
