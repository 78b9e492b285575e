"""PRM inputs built incrementally, as token ids, one piece per step.

A path's PRM input is ``head + piece(step 1) + ... + piece(step k) + closing``: the
head holds the format's preamble and the question, a piece holds one step's tokens
and its separator / turn tokens (with the position whose hidden state is the step's
reward), the closing tokens complete the path. Each candidate's piece is built once,
when it is first needed, from its own step only; its prefix length and a digest of
its prefix (chained from its parent's) follow in O(piece). Nothing re-renders or
re-tokenizes a whole path (issue "The real engine does the paper's work", item 6).

``rows`` turns the batch plan of ``PRMCache`` (``ScoreItem``: cached prefix, table)
into the rows a PRM forward runs: the pieces after the cached ancestor, then the
closing tokens. ``path_rewards`` chains step rewards the same way: the rewards of a
cached prefix were computed when it was scored, so only the new pieces' rewards come
from this batch. Identical prefixes (same digest) keep the first rewards computed for
them, so identical texts tie exactly whatever batch they ran in.
"""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from specscale.engine.backend import ScoreItem
from specscale.engine.torch.prm import PRMRow


@dataclass(frozen=True, eq=False)
class Piece:
    ids: np.ndarray  # int64, checked against the vocabulary when the piece is made
    reward_offset: int  # index in ids of the token whose hidden state gives the reward
    prefix_len: int  # head + pieces up to and including this one
    digest: bytes  # of the whole prefix's token ids (chained)
    parent: "Piece | None" = None  # the parent candidate's piece (the head's: None)


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
        self._path_rewards: "weakref.WeakKeyDictionary[Any, tuple[float, ...]]" = weakref.WeakKeyDictionary()

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
        arr = np.array(ids, dtype=np.int64).reshape(-1)
        if self.vocab_size is not None and arr.size:
            bad = (arr < 0) | (arr >= self.vocab_size)
            if bad.any():
                raise ValueError(f"{what}: token id {int(arr[np.argmax(bad)])} outside the PRM vocabulary "
                                 f"[0, {self.vocab_size})")
        return arr

    # ------------------------------------------------------------------ rows
    def chain(self, it: ScoreItem) -> list[Any]:
        """Candidates whose pieces this item computes: after its cached ancestor, down to it."""
        nodes = []
        node = it.candidate
        stop = it.cached_from if it.block_table is not None else None
        while node is not None and node is not stop and node.round >= 0:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def row(self, it: ScoreItem, chain: list[Any]) -> PRMRow:
        """The item's new tokens: one concatenation of checked pieces (no per-token work)."""
        parts: list[np.ndarray] = []
        positions: list[int] = []
        n = 0
        if it.n_cached == 0:  # nothing cached: the head too
            parts.append(self.head(it.candidate.request_id).ids)
            n = parts[0].size
        pieces: list[Piece] = []
        if chain:  # the chain's pieces through their parent links: one look-up per row
            p = self.piece(chain[-1])
            for _ in chain:
                pieces.append(p)
                p = p.parent
            pieces.reverse()
        for p in pieces:
            positions.append(n + p.reward_offset)
            parts.append(p.ids)
            n += p.ids.size
        if not it.prefix_only:
            parts.append(self.closing)
            n += self.closing.size
        if n != it.n_new:
            raise RuntimeError(
                f"candidate {it.candidate.cid}: the PRM plan counted {it.n_new} new tokens, its pieces hold {n}"
            )
        return PRMRow(np.concatenate(parts), it.n_cached, it.block_table, positions)

    def rows(self, items: Sequence[ScoreItem]) -> tuple[list[PRMRow], list[list[Any]]]:
        chains = [self.chain(it) for it in items]
        return [self.row(it, ch) for it, ch in zip(items, chains)], chains

    # ------------------------------------------------------------------ rewards
    def path_rewards(self, it: ScoreItem, chain: list[Any], rewards: Sequence[float]) -> list[float]:
        """Per-step rewards of the item's whole path: the cached prefix's (computed when it
        was scored) followed by this row's; first computation wins for a given prefix."""
        if not chain:  # a head-wave item: the head has no step, hence no reward
            return []
        first = chain[0]
        base = self._rewards_of(first.parent) if first.parent is not None and first.round > 0 else ()
        for node, r in zip(chain, rewards):
            base = self._rewards_seen.setdefault(self.piece(node).digest, (*base, float(r)))
            self._path_rewards[node] = base
        return list(base)

    def _rewards_of(self, c: Any) -> tuple[float, ...]:
        if c.round < 0:
            return ()
        r = self._path_rewards.get(c)
        if r is None:
            r = self._rewards_seen.get(self.piece(c).digest)
        if r is None:
            raise RuntimeError(f"candidate {c.cid}: its prefix is cached but its rewards are unknown")
        return r


def _digest(prev: bytes, ids: np.ndarray) -> bytes:
    """The prefix digest, chained from the parent's: it hashes only this piece's tokens
    (4-byte little-endian each, the bytes the per-token encoding gave)."""
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(len(ids).to_bytes(4, "little"))
    h.update(np.asarray(ids, dtype="<i4").tobytes())
    return h.digest()
