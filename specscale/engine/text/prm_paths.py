"""PRM inputs built incrementally, as token ids, one piece per step.

A path's PRM input is ``head + piece(step 1) + ... + piece(step k) + closing``: the
head holds the format's preamble and the question, a piece holds one step's tokens
and its separator / turn tokens (with the position whose hidden state is the step's
reward), the closing tokens complete the path. Each candidate's piece is built once,
when it is first needed, from its own step only; its prefix length and a digest of
its prefix (chained from its parent's) follow in O(piece). Nothing re-renders or
re-tokenizes a whole path.

``rows`` turns the batch plan of ``PRMCache`` (``ScoreItem``: cached prefix, table)
into the rows a PRM forward runs: the path's tokens after the cached prefix, then the
closing tokens. A piece keeps its whole path's ids as an array (its parent's, extended
once, when first asked for) and its steps' reward positions as a tuple (made with the
piece), so a row is one slice and one concatenation whatever the path's depth: no
per-step Python work per batch.
``path_rewards`` chains step rewards the same way: the rewards of a cached prefix were
computed when it was scored, so only the new pieces' rewards come from this batch.
Identical prefixes (same digest) keep the first rewards computed for them, so identical
texts tie exactly whatever batch they ran in.
"""
from __future__ import annotations

import hashlib
import sys
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from specscale.engine.backend import ScoreItem
from specscale.engine.text.prm_rows import PRMRow, TokenRun


class Piece:
    """One step's PRM tokens (or a request's head) and what its path up to it holds."""

    __slots__ = ("ids", "reward_offset", "prefix_len", "digest", "parent", "depth", "rewards_at", "_path")

    def __init__(self, ids: np.ndarray, reward_offset: int, prefix_len: int, digest: bytes,
                 parent: "Piece | None" = None):
        self.ids = ids  # int32 (as hashed and as a PRM batch holds them), checked against the vocabulary once
        self.reward_offset = reward_offset  # index in ids of the token whose hidden state gives the reward
        self.prefix_len = prefix_len  # head + pieces up to and including this one
        self.digest = digest  # of the whole prefix's token ids (chained)
        self.parent = parent  # the parent candidate's piece (the head's: None)
        self.depth = 0 if parent is None else parent.depth + 1  # steps on the path (the head: 0)
        # Positions in the path of its steps' reward tokens, in step order: O(depth), a tuple
        # (extended in ~0.1 us, where an array took ~1.5), made with the piece; a whole-path
        # row reads it as it is.
        self.rewards_at: tuple[int, ...] = () if parent is None else (
            *parent.rewards_at, parent.prefix_len + reward_offset)
        self._path: np.ndarray | None = None

    def path(self) -> np.ndarray:
        """The path's token ids (head + pieces through this one). Built from the parent's on
        first use and kept: a piece's path is asked for by its own row and its children's."""
        if self._path is None:
            todo, p = [], self
            while p is not None and p._path is None:  # iterative: a deep path must not recurse
                todo.append(p)
                p = p.parent
            for q in reversed(todo):
                q._path = q.ids if q.parent is None else np.concatenate((q.parent._path, q.ids))
        return self._path


_LITTLE_ENDIAN = sys.byteorder == "little"


class PRMPaths:
    def __init__(
        self,
        head_ids: Callable[[int], Sequence[int]],  # request id -> head token ids
        piece_of: Callable[[Any], tuple[Sequence[int], int]],  # candidate -> (piece ids, reward offset)
        closing_ids: Sequence[int],
        vocab_size: int | None = None,
    ) -> None:
        """vocab_size: every piece's token ids are checked against it once, when the piece is
        made (a path's prefix was checked with its ancestors' pieces), not per batch."""
        self._head_ids = head_ids
        self._piece_of = piece_of
        self.vocab_size = vocab_size
        self.closing = self._ids(tuple(closing_ids), "the closing tokens")
        self._heads: dict[int, Piece] = {}
        self._pieces: "weakref.WeakKeyDictionary[Any, Piece]" = weakref.WeakKeyDictionary()
        self._rewards_seen: dict[bytes, tuple[float, ...]] = {}

    # ------------------------------------------------------------------ pieces
    def head(self, request_id: int) -> Piece:
        p = self._heads.get(request_id)
        if p is None:
            ids = self._ids(self._head_ids(request_id), f"request {request_id}: the PRM head")
            p = self._heads[request_id] = Piece(ids, -1, len(ids), _digest(b"", ids))
        return p

    def piece(self, c: Any) -> Piece:
        """The root's piece is the request's head."""
        if c.round < 0:
            return self.head(c.request_id)
        p = self._pieces.get(c)
        if p is None:
            parent = self.piece(c.parent) if c.parent is not None else self.head(c.request_id)
            ids, off = self._piece_of(c)
            ids = self._ids(ids, f"candidate {c.cid}: its PRM piece")
            if not 0 <= off < len(ids):
                raise ValueError(f"candidate {c.cid}: reward offset {off} outside its {len(ids)}-token PRM piece")
            p = self._pieces[c] = Piece(ids, off, parent.prefix_len + len(ids), _digest(parent.digest, ids), parent)
        return p

    def prefix_len(self, c: Any) -> int:
        return self.piece(c).prefix_len

    def _ids(self, ids: Sequence[int], what: str) -> np.ndarray:
        """The ids as an int32 array, checked against the vocabulary (``what`` names them in
        an error)."""
        arr = None
        if not isinstance(ids, np.ndarray):
            try:  # Python ints straight to int32 (one pass); one that does not fit raises
                arr = np.array(ids, dtype=np.int32)
            except OverflowError:
                pass
        elif ids.dtype == np.int32:
            arr = ids.copy()
        if arr is None:  # a wider array, or a value beyond int32: checked in int64
            wide = np.array(ids, dtype=np.int64).reshape(-1)
            self._check(wide, np.uint64, what)
            return wide.astype(np.int32)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        self._check(arr, np.uint32, what)
        return arr

    def _check(self, arr: np.ndarray, unsigned: type, what: str) -> None:
        # One reduction checks both ends: a negative id read as unsigned is past any vocabulary.
        if self.vocab_size is not None and arr.size and int(arr.view(unsigned).max()) >= self.vocab_size:
            bad = (arr < 0) | (arr >= self.vocab_size)
            raise ValueError(f"{what}: token id {int(arr[np.argmax(bad)])} outside the PRM vocabulary "
                             f"[0, {self.vocab_size})")

    # ------------------------------------------------------------------ rows
    def row(self, it: ScoreItem) -> PRMRow:
        """The item's new tokens: its path after the cached prefix (a slice of a piece's
        path), then the closing tokens; reward positions of the steps after that prefix.
        A piece whose path is not built yet (a fresh leaf) reads its parent's and appends
        its own ids: its path is built only if a child asks for it."""
        p = self.piece(it.candidate)
        skip, first = 0, 0  # tokens and steps of the cached prefix
        if it.n_cached:
            anc = it.cached_from if it.block_table is not None else None
            q = self.piece(anc) if anc is not None else None
            if q is None or q.prefix_len != it.n_cached:
                raise RuntimeError(
                    f"candidate {it.candidate.cid}: the PRM plan reads {it.n_cached} cached tokens, but its cached "
                    f"ancestor's prefix holds {'none' if q is None else q.prefix_len}"
                )
            skip, first = q.prefix_len, q.depth
        rewards = tuple(x - skip for x in p.rewards_at[first:]) if skip else p.rewards_at
        if p._path is None and p.parent is not None:
            path = p.parent.path()
            parts = [path[skip:], p.ids] if skip < path.size else [p.ids]
        else:
            parts = [p.path()[skip:]]
        n = p.prefix_len - skip
        if not it.prefix_only:
            parts.append(self.closing)
            n += self.closing.size
        if n != it.n_new:
            raise RuntimeError(
                f"candidate {it.candidate.cid}: the PRM plan counted {it.n_new} new tokens, its pieces hold {n}"
            )
        return PRMRow(TokenRun(parts, n), it.n_cached, it.block_table, rewards)

    def rows(self, items: Sequence[ScoreItem]) -> list[PRMRow]:
        return [self.row(it) for it in items]

    # ------------------------------------------------------------------ rewards
    def path_rewards(self, it: ScoreItem, rewards: Sequence[float]) -> list[float]:
        """Per-step rewards of the item's whole path: the cached prefix's (computed when it
        was scored) followed by this row's, one per step after that prefix; first
        computation wins for a given prefix."""
        if not len(rewards):  # a head-wave item: the head has no step, hence no reward
            return []
        new = []
        p = self.piece(it.candidate)
        for _ in range(len(rewards)):
            new.append(p)
            p = p.parent
        base = self._rewards_of(p, it.candidate)
        for piece, r in zip(reversed(new), rewards):
            base = self._rewards_seen.setdefault(piece.digest, (*base, float(r)))
        return list(base)

    def _rewards_of(self, p: Piece | None, c: Any) -> tuple[float, ...]:
        """Rewards of the path up to piece ``p`` (the head's: none), for candidate ``c``'s row."""
        if p is None or p.depth == 0:
            return ()
        r = self._rewards_seen.get(p.digest)
        if r is None:
            raise RuntimeError(f"candidate {c.cid}: its prefix is cached but its rewards are unknown")
        return r


def _digest(prev: bytes, ids: np.ndarray) -> bytes:
    """The prefix digest, chained from the parent's: it hashes only this piece's tokens
    (int32 ``ids``, 4-byte little-endian each, the bytes the per-token encoding gave)."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(len(ids).to_bytes(4, "little"))
    h.update(ids if _LITTLE_ENDIAN else ids.astype("<i4"))
    return h.digest()
