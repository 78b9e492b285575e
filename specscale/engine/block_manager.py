"""KV-cache accounting in fixed-size blocks with reference counts.

Both backends account memory the same way, so preemption and the memory figures mean
the same thing in the simulator and on a real GPU. A fork shares every block of its
parent (reference count + 1); the shared partial last block is copied only when one
of the sharers writes into it (copy-on-write), which is when a fork first decodes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class OutOfBlocks(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks."""


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int = 16
    refcount: list[int] = field(init=False)
    _free: deque[int] = field(init=False)
    peak_used: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"KV pool needs at least one block, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        self.refcount = [0] * self.num_blocks
        self._free = deque(range(self.num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def _allocate(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV block")
        block = self._free.popleft()
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
                self._free.append(block)
        table.clear()
