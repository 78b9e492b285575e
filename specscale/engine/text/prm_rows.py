"""The rows of a PRM forward as data: what a row computes (``PRMRow``) and its token ids
held as the runs they come from (``TokenRun``). Built from a path by prm_paths.py, read
by every engine's PRM (the torch PRM packs them into forwards; vLLM sends their ids).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class TokenRun:
    """A row's token ids held as the consecutive arrays they come from (a slice of a path,
    a new piece, the closing tokens), joined only when something reads them as one: a
    PRM batch copies the parts of all its rows into its input in a single concatenation."""

    __slots__ = ("parts", "_n", "_joined")

    def __init__(self, parts: Sequence[np.ndarray], n: int | None = None):
        """n: the parts' total size, when the caller knows it."""
        self.parts = parts
        self._n = sum(int(x.size) for x in parts) if n is None else n
        self._joined: np.ndarray | None = None

    def joined(self) -> np.ndarray:
        if self._joined is None:
            self._joined = np.concatenate(self.parts) if len(self.parts) != 1 else self.parts[0]
        return self._joined

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self.joined()[i]

    def __iter__(self):
        return iter(self.joined())

    def __array__(self, dtype=None, copy=None):
        a = self.joined()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"TokenRun({self.joined().tolist()})"


@dataclass(frozen=True)
class PRMRow:
    """One row of a PRM forward.

    token_ids:        the new (uncached) tokens this pass computes (at least one).
    start:            tokens of this row already in the PRM KV cache (0 = none).
    block_table:      PRM KV blocks covering start + len(token_ids) positions; None = no
                      cache (start must be 0; nothing is written).
    reward_positions: indices INTO token_ids whose hidden states give rewards, in step order.
    """

    token_ids: Sequence[int]
    start: int = 0
    block_table: Sequence[int] | None = None
    reward_positions: Sequence[int] = ()
