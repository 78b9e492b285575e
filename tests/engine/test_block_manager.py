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


# ---------------------------------------------------------------------------- prefix cache
from specscale.engine.block_manager import ROOT_HASH, chain_hash, chain_hashes  # noqa: E402


def _filled(bm: BlockManager, tokens: list[int]) -> tuple[list[int], list[bytes]]:
    """A table holding `tokens`, its full blocks registered as a forward would leave them."""
    table: list[int] = []
    bm.append(table, 0, len(tokens))
    hashes = chain_hashes(tokens, bm.block_size, len(tokens) // bm.block_size)
    for b, h in zip(table, hashes):
        assert bm.register(b, h)
    return table, hashes


def test_chain_hash_covers_the_whole_history():
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    b = chain_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different history before it
    assert a[0] == chain_hash(ROOT_HASH, [1, 2, 3, 4]) and len(a[0]) == 16
    ext = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4, 3, out=list(a))
    assert ext[:2] == a and ext[2] == chain_hash(a[1], [9, 10, 11, 12])


def test_freed_blocks_are_found_until_reused_in_lru_order():
    bm = BlockManager(num_blocks=4, block_size=4)
    t1, h1 = _filled(bm, [1, 2, 3, 4, 5, 6])  # one full (hashed) block and a partial one
    assert bm.num_cached == 1 and bm.hash_of(t1[1]) is None  # the partial block is never hashed
    t2, h2 = _filled(bm, [7, 7, 7, 7])
    b1, b2 = t1[0], t2[0]
    bm.free(t1)  # freed first: b1, then the partial block
    bm.free(t2)
    assert bm.num_free == 4 and bm.num_used == 0 and bm.num_cached == 2  # free but findable
    assert bm.lookup(h1[0]) == b1 and bm.lookup(h2[0]) == b2
    assert not bm.errors()
    # Re-attach takes b2 out of the middle of the free list.
    assert bm.reattach([h2[0]]) == [b2] and bm.refcount[b2] == 1 and bm.num_free == 3
    # Allocation reuses the block freed longest ago: the never-used block 3, then b1
    # (whose hash is dropped as it is reused), then the old partial block.
    order = [bm._allocate() for _ in range(3)]
    assert order == [3, b1, 1] and bm.lookup(h1[0]) is None and bm.hash_of(b1) is None
    assert bm.evicted_blocks == 1 and bm.lookup(h2[0]) == b2
    assert not bm.errors()


def test_reattach_stops_at_the_first_miss_and_shares_live_blocks():
    bm = BlockManager(num_blocks=8, block_size=2)
    t, h = _filled(bm, [1, 2, 3, 4, 5, 6])
    assert bm.reattach([h[0], b"missing", h[2]]) == [t[0]]
    assert bm.refcount[t[0]] == 2  # live: shared, not taken from the free list
    assert bm.reattach(h) == t and [bm.refcount[b] for b in t] == [3, 2, 2]
    assert not bm.errors()


def test_one_block_per_hash():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, ha = _filled(bm, [1, 2])
    b: list[int] = []
    bm.append(b, 0, 2)
    assert not bm.register(b[0], ha[0])  # the same content, computed twice: the live holder stays
    assert bm.lookup(ha[0]) == a[0] and bm.hash_of(b[0]) is None
    old = a[0]
    bm.free(a)  # now the holder is only cached: a live duplicate takes over
    assert bm.register(b[0], ha[0]) and bm.lookup(ha[0]) == b[0] and bm.hash_of(old) is None
    with pytest.raises(RuntimeError):
        bm.register(old, ha[0])  # a free block cannot be registered
    assert not bm.errors()


def test_prefix_caching_off_is_a_plain_pool():
    bm = BlockManager(num_blocks=4, block_size=2, prefix_caching=False)
    t: list[int] = []
    bm.append(t, 0, 4)
    h = chain_hashes([1, 2, 3, 4], 2, 2)
    assert not bm.register(t[0], h[0]) and bm.num_cached == 0
    bm.free(t)
    assert bm.lookup(h[0]) is None and bm.reattach(h) == []
    assert [bm._allocate() for _ in range(4)] == [2, 3, 0, 1]  # FIFO of frees, as before
