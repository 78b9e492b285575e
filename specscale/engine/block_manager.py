"""KV-cache accounting in fixed-size blocks with reference counts.

Both backends account memory the same way, so preemption and the memory figures mean
the same thing in the simulator and on a real GPU. A fork shares every block of its
parent (reference count + 1); the shared partial last block is copied only when one
of the sharers writes into it (copy-on-write), which is when a fork first decodes.

Prefix caching (``prefix_caching=True``, vLLM / nano-vllm style): a *full* block whose
KV has been computed is registered under the chain hash of every token up to its end
(``chain_hash``). A block whose reference count drops to 0 goes to the free list but
keeps its hash, so a sequence that lost its KV (preemption) or never had it (a fork of
a preempted parent, a prompt that shares a prefix with another) can re-attach it instead
of recomputing. The free list is LRU: allocation reuses the block freed longest ago,
and only then is its hash dropped (its data is about to be overwritten). Partial blocks
are never hashed: they are still written to. With ``prefix_caching=False`` nothing is
registered and the manager behaves exactly as a plain refcounted pool (same order of
block ids).
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

# The chain hash is a 128-bit BLAKE2b digest: collisions between distinct histories are
# out of reach in practice, so a hit needs no token-by-token verification.
_DIGEST = 16
ROOT_HASH = b""  # "previous block" of a history's first block


def chain_hash(prev: bytes, tokens: Sequence[int]) -> bytes:
    """Hash of a block given the hash of the block before it: covers every token up to its end."""
    return hashlib.blake2b(prev + array("q", tokens).tobytes(), digest_size=_DIGEST).digest()


def chain_hashes(tokens: Sequence[int], block_size: int, n_blocks: int, out: Optional[list[bytes]] = None) -> list[bytes]:
    """Chain hashes of the first n_blocks full blocks of `tokens`. Given `out` (the hashes
    of the first blocks, already computed), it is extended in place and returned."""
    if out is None:
        out = []
    prev = out[-1] if out else ROOT_HASH
    for i in range(len(out), n_blocks):
        prev = chain_hash(prev, tokens[i * block_size: (i + 1) * block_size])
        out.append(prev)
    return out


class OutOfBlocks(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks."""


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int = 16
    prefix_caching: bool = True
    refcount: list[int] = field(init=False)
    # Free blocks in the order they were freed (oldest first); an OrderedDict so that a
    # re-attached free block can leave the middle of the list in O(1).
    _free: OrderedDict[int, None] = field(init=False)
    _hash_of: list[Optional[bytes]] = field(init=False)  # block -> its registered chain hash
    _by_hash: dict[bytes, int] = field(init=False)  # chain hash -> the one block holding it
    peak_used: int = field(init=False, default=0)
    evicted_blocks: int = field(init=False, default=0)  # hashed free blocks reallocated (hash dropped)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"KV pool needs at least one block, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        self.refcount = [0] * self.num_blocks
        self._free = OrderedDict.fromkeys(range(self.num_blocks))
        self._hash_of = [None] * self.num_blocks
        self._by_hash = {}

    @property
    def num_free(self) -> int:
        """Blocks with no reference, cached (still findable by hash) or not."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks registered in the hash table (live or free)."""
        return len(self._by_hash)

    def _allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV block")
        block, _ = self._free.popitem(last=False)
        h = self._hash_of[block]
        if h is not None:  # its KV is about to be overwritten: no longer findable
            del self._by_hash[h]
            self._hash_of[block] = None
            self.evicted_blocks += 1
        self.refcount[block] = 1
        used = self.num_used
        if used > self.peak_used:
            self.peak_used = used
        return block

    def blocks_needed(self, table: list[int], num_cached: int, n_new: int) -> int:
        """Blocks an append of n_new tokens after num_cached needs (incl. copy-on-write)."""
        bs = self.block_size
        total = -(-(num_cached + n_new) // bs)
        need = max(0, total - len(table))
        if n_new > 0 and num_cached % bs and self.refcount[table[num_cached // bs]] > 1:
            need += 1
        return need

    def append(self, table: list[int], num_cached: int, n_new: int) -> list[tuple[int, int]]:
        """Grow `table` in place to hold num_cached + n_new tokens.

        Returns the (src, dst) block copies a real cache must perform for
        copy-on-write of a shared partial last block.
        """
        bs = self.block_size
        copies: list[tuple[int, int]] = []
        if n_new > 0 and num_cached % bs:
            i = num_cached // bs
            src = table[i]
            if self.refcount[src] > 1:
                dst = self._allocate()
                self.refcount[src] -= 1
                table[i] = dst
                copies.append((src, dst))
        total = -(-(num_cached + n_new) // bs)
        while len(table) < total:
            table.append(self._allocate())
        return copies

    def fork(self, table: list[int], num_cached: int) -> list[int]:
        """A new table sharing the blocks that hold the first num_cached tokens."""
        shared = table[: -(-num_cached // self.block_size)] if num_cached else []
        for block in shared:
            self.refcount[block] += 1
        return list(shared)

    def free(self, table: list[int]) -> None:
        """Drop one reference to every block of `table` and clear it."""
        for block in table:
            rc = self.refcount[block] - 1
            if rc < 0:
                raise RuntimeError(f"double free of KV block {block}")
            self.refcount[block] = rc
            if rc == 0:
                self._free[block] = None  # most recently freed: reused last
        table.clear()

    # ------------------------------------------------------------------ prefix cache
    def register(self, block: int, h: bytes) -> bool:
        """Make a full, computed block findable under chain hash h. Returns whether it is.

        One block per hash: if another block already holds h and is in use, the new one
        stays unregistered (same KV, no need for two); if the holder is free, the live
        block takes its place (it will stay findable longer).
        """
        if not self.prefix_caching:
            return False
        if self.refcount[block] < 1:
            raise RuntimeError(f"register of free KV block {block}")
        have = self._hash_of[block]
        if have is not None:
            if have != h:
                raise RuntimeError(f"KV block {block} registered under two hashes")
            return True
        other = self._by_hash.get(h)
        if other is not None:
            if self.refcount[other] > 0:
                return False
            self._hash_of[other] = None  # a free duplicate: plain free block from now on
        self._by_hash[h] = block
        self._hash_of[block] = h
        return True

    def lookup(self, h: bytes) -> Optional[int]:
        return self._by_hash.get(h) if self.prefix_caching else None

    def reattach(self, hashes: Iterable[bytes]) -> list[int]:
        """Blocks holding the given chain hashes, in order, up to the first miss; each gets
        one more reference (a free one leaves the free list)."""
        table: list[int] = []
        if not self.prefix_caching:
            return table
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            if self.refcount[block] == 0:
                del self._free[block]
            self.refcount[block] += 1
            table.append(block)
        if table:
            used = self.num_used
            if used > self.peak_used:
                self.peak_used = used
        return table

    def hash_of(self, block: int) -> Optional[bytes]:
        return self._hash_of[block]

    def errors(self) -> list[str]:
        """Violations of the pool's own invariants: free <=> refcount 0, and the hash table
        is a bijection between hashes and hashed blocks."""
        errors = []
        for b, rc in enumerate(self.refcount):
            if rc < 0:
                errors.append(f"block {b}: negative refcount {rc}")
            if (rc == 0) != (b in self._free):
                errors.append(f"block {b}: refcount {rc} but {'in' if b in self._free else 'not in'} the free list")
        hashed = 0
        for b, h in enumerate(self._hash_of):
            if h is None:
                continue
            hashed += 1
            if self._by_hash.get(h) != b:
                errors.append(f"block {b}: hash entry points to {self._by_hash.get(h)}")
        if hashed != len(self._by_hash):
            errors.append(f"{len(self._by_hash)} hash entries for {hashed} hashed blocks")
        if not self.prefix_caching and self._by_hash:
            errors.append("prefix caching is off but blocks are hashed")
        return errors

    def reference_errors(self, tables, holder: str = "sequences") -> list[str]:
        """Refcount invariant against the tables that hold blocks: every block's count
        equals the number of tables holding it, and the used blocks are the referenced ones."""
        counts = [0] * self.num_blocks
        for table in tables:
            for b in table:
                counts[b] += 1
        errors = [f"block {b}: refcount {have}, referenced by {want} {holder}"
                  for b, (want, have) in enumerate(zip(counts, self.refcount)) if want != have]
        referenced = sum(1 for c in counts if c)
        if referenced != self.num_used:
            errors.append(f"{self.num_used} blocks used, {referenced} referenced by {holder}")
        return errors
