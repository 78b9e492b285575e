"""The PRM's prefix cache, as bookkeeping: which path prefixes have KV in the PRM pool.

A candidate's PRM input is its path's *prefix* (format head with the question, then
one piece per step: the step's tokens and its separator / turn tokens) followed by
the path's *closing* tokens (e.g. the chat template's end of turn). A candidate whose
path can still be extended keeps an *entry*: the PRM KV blocks of its prefix. A task
for a child then computes only what lies after the nearest cached ancestor's prefix:
its own piece and the closing tokens (docs/design.md §6, ``engine.prm_prefix_cache``).

This module is shared by every backend, so the simulator and the torch engine count
the same PRM input tokens for the same tree: it decides, per PRM batch, each task's
cached part and new part and hands out block tables (``ScoreItem``); the torch backend
runs them over its paged PRM cache, the simulator prices them.

Rules:
* Blocks are refcounted (``BlockManager``): every entry extending the same verified
  prefix shares its full blocks; a child's table copies a shared partial last block
  before writing into it (copy-on-write), as the generator's forks do.
* The closing tokens are computed in the task's row and then dropped: the table is
  cut back to the prefix, so they never become part of a child's prefix.
* Candidates merged into one task by computation deduplication (identical steps) get
  an entry each on the head's blocks: the search may select any of them.
* Ancestors recomputed in a row (its parent was scored in the same batch, or an
  ancestor's entry was evicted; the request's head on its first batch) get an entry
  too when something can still extend them.
* An entry is released when nothing can extend it any more: its candidate was
  cancelled, pruned or not selected (``discard``), or every child it will have has
  been scored (``release_finished_parents``), or its request ended.
* Tasks of one batch that share a request head nothing has cached yet read it from a
  *head wave*: a prefix-only item planned before them and computed in an earlier
  forward, instead of every one of them recomputing the question in its own row.
* Under pressure the least recently used entries not used by the batch being planned
  are evicted (their prefix is recomputed later); a task that still does not fit runs
  uncached (whole path, no table): the cache never fails a run that fits without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from specscale.engine.backend import ScoreItem
from specscale.engine.block_manager import BlockManager


@dataclass
class PRMEntry:
    cand: Any  # the candidate (the root for a request's head)
    blocks: list[int]  # PRM KV blocks of its prefix
    n_tokens: int  # prefix length
    last_use: int


@dataclass
class PRMCacheStats:
    evictions: int = 0  # entries dropped under memory pressure
    uncached_tasks: int = 0  # tasks that ran without the cache (pool too small for them)
    cached_tokens: int = 0  # prefix tokens read from the cache instead of recomputed
    peak_blocks: int = 0


@dataclass
class PRMCache:
    """enabled=False: every task recomputes its whole path (no pool, no entries)."""

    enabled: bool
    num_blocks: int
    block_size: int
    path_tokens: Callable[[Any], int]  # prefix length of a candidate's path (root: the head)
    closing_tokens: int
    expansion: int  # children a selected parent gets (M)
    blocks: Optional[BlockManager] = field(init=False, default=None)
    entries: dict[int, PRMEntry] = field(init=False, default_factory=dict)  # cid -> entry
    by_request: dict[int, set[int]] = field(init=False, default_factory=dict)
    stats: PRMCacheStats = field(init=False, default_factory=PRMCacheStats)
    _discarded: dict[int, set[int]] = field(init=False, default_factory=dict)  # request -> cids
    _tick: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.enabled:
            if self.num_blocks < 1:
                raise ValueError(
                    f"engine.prm_prefix_cache=true needs a PRM KV pool of at least one block, got {self.num_blocks} "
                    "(raise engine.prm_kv_blocks or set engine.prm_prefix_cache=false)"
                )
            self.blocks = BlockManager(self.num_blocks, self.block_size)

    # ------------------------------------------------------------------ planning
    def plan(self, cands: Sequence[Any]) -> list[ScoreItem]:
        """One ScoreItem per candidate to score: its cached part, new part and table."""
        if not self.enabled:
            return [ScoreItem(c, self.path_tokens(c) + self.closing_tokens, 0) for c in cands]
        self._tick += 1
        pinned: set[int] = set()
        items = self._head_wave(cands, pinned)
        bm = self.blocks
        for c in cands:
            anc = self._cached_ancestor(c)
            total = self.path_tokens(c) + self.closing_tokens
            n_cached = anc.n_tokens if anc is not None else 0
            if anc is not None:
                anc.last_use = self._tick
                pinned.add(id(anc))
            table = bm.fork(anc.blocks, n_cached) if anc is not None else []
            n_new = total - n_cached
            need = bm.blocks_needed(table, n_cached, n_new)
            while need > bm.num_free and self._evict_one(pinned):
                pass
            if need > bm.num_free:  # cannot hold this task even after evicting: run it uncached
                bm.free(table)
                self.stats.uncached_tasks += 1
                items.append(ScoreItem(c, total, 0))
                continue
            copies = bm.append(table, n_cached, n_new)
            self.stats.cached_tokens += n_cached
            items.append(ScoreItem(c, n_new, n_cached, table, copies, anc.cand if anc is not None else None))
        self.stats.peak_blocks = max(self.stats.peak_blocks, bm.num_used)
        return items

    def _head_wave(self, cands: Sequence[Any], pinned: set[int]) -> list[ScoreItem]:
        """Prefix-only items for request heads that two or more of these tasks need and
        nothing has cached yet (a request's first batch, or its head was evicted). The
        head's entry is stored now, so the tasks planned after fork it; the backend
        computes it in a forward before theirs (``score_waves``). Without the wave every
        such task would recompute the whole head (the question) in its own row."""
        uncached: dict[int, list[Any]] = {}
        for c in cands:
            if self._cached_ancestor(c) is None:
                uncached.setdefault(c.request_id, []).append(c)
        bm = self.blocks
        wave = []
        for group in uncached.values():
            root = group[0]
            while root.parent is not None:
                root = root.parent
            if len(group) < 2 or not self._extendable(root):
                continue
            n = self.path_tokens(root)
            table: list[int] = []
            need = bm.blocks_needed(table, 0, n)
            while need > bm.num_free and self._evict_one(pinned):
                pass
            if need > bm.num_free:
                continue  # no room: its tasks recompute the head in their rows, as without the wave
            bm.append(table, 0, n)
            self._store(root, table, n)
            pinned.add(id(self.entries[root.cid]))
            wave.append(ScoreItem(root, n, 0, bm.fork(table, n), prefix_only=True))
        return wave

    def _cached_ancestor(self, c: Any) -> Optional[PRMEntry]:
        node = c.parent
        while node is not None:
            e = self.entries.get(node.cid)
            if e is not None:
                return e
            node = node.parent
        return None

    def _evict_one(self, pinned: set[int]) -> bool:
        victims = [e for e in self.entries.values() if id(e) not in pinned]
        if not victims:
            return False
        victim = min(victims, key=lambda e: e.last_use)
        self._drop(victim.cand)
        self.stats.evictions += 1
        return True

    # ------------------------------------------------------------------ after scoring
    def commit(self, items: Sequence[ScoreItem], merged: Optional[Mapping[int, Sequence[Any]]] = None) -> None:
        """Keep the prefixes this batch computed that can still be extended; free the rest.

        ``merged``: head cid -> the other candidates of its task (computation
        deduplication merged identical steps into one task). They share the head's prefix,
        so each that can still be extended gets an entry on the same blocks: the search
        may select any of them, and its children must find the prefix as a child of the
        head would."""
        if not self.enabled:
            return
        merged = merged or {}
        bm = self.blocks
        for it in items:
            table = it.block_table
            if table is None:
                continue
            c = it.candidate
            # Ancestors whose pieces this row recomputed (up to the cached one, or the root).
            node = c.parent
            while node is not None and node is not it.cached_from:
                if node.cid not in self.entries and self._extendable(node):
                    n = self.path_tokens(node)
                    self._store(node, bm.fork(table, n), n)
                node = node.parent
            n = self.path_tokens(c)
            keep = -(-n // self.block_size)
            bm.free(table[keep:])  # blocks holding only closing tokens
            del table[keep:]
            for d in (c, *merged.get(c.cid, ())):
                if d.cid not in self.entries and self._extendable(d) and self.path_tokens(d) == n:
                    self._store(d, bm.fork(table, n), n)
            bm.free(table)  # the entries hold their own references
        self.stats.peak_blocks = max(self.stats.peak_blocks, bm.num_used)

    def _store(self, cand: Any, blocks: list[int], n_tokens: int) -> None:
        self.entries[cand.cid] = PRMEntry(cand, blocks, n_tokens, self._tick)
        self.by_request.setdefault(cand.request_id, set()).add(cand.cid)

    def _extendable(self, c: Any) -> bool:
        """Can a child of c still need c's prefix?"""
        if c.cid in self._discarded.get(c.request_id, ()) or not c.live or c.terminal or c.pruned:
            return False
        if c.round >= 0 and len(c.children) < self.expansion:
            return True
        return any(ch.live and ch.score is None for ch in c.children.values()) or not c.children

    # ------------------------------------------------------------------ releases
    def discard(self, c: Any) -> None:
        """c will never be extended (cancelled, pruned, not selected)."""
        if not self.enabled:
            return
        self._discarded.setdefault(c.request_id, set()).add(c.cid)
        self._drop(c)

    def release_finished_parents(self, scored: Sequence[Any]) -> None:
        """After a batch's scores were applied: parents whose every child is scored."""
        if not self.enabled:
            return
        for c in scored:
            for node in (c, c.parent):
                if node is not None and node.cid in self.entries and not self._extendable(node):
                    self._drop(node)

    def release_request(self, request_id: int) -> None:
        if not self.enabled:
            return
        for cid in list(self.by_request.pop(request_id, ())):
            e = self.entries.pop(cid, None)
            if e is not None:
                self.blocks.free(e.blocks)
        self._discarded.pop(request_id, None)

    def _drop(self, c: Any) -> None:
        e = self.entries.pop(c.cid, None)
        if e is None:
            return
        self.blocks.free(e.blocks)
        ids = self.by_request.get(c.request_id)
        if ids is not None:
            ids.discard(c.cid)

    # ------------------------------------------------------------------ accounting
    @property
    def num_used(self) -> int:
        return self.blocks.num_used if self.blocks is not None else 0

    def errors(self) -> list[str]:
        """Invariant violations (empty when consistent): refcounts equal references by
        entries, nothing held for a cancelled candidate, used blocks all referenced."""
        if not self.enabled:
            return []
        errors = self.blocks.reference_errors((e.blocks for e in self.entries.values()), "PRM entries")
        for cid, e in self.entries.items():
            if not e.cand.live:
                errors.append(f"PRM entry of cancelled candidate {cid}")
            if len(e.blocks) != -(-e.n_tokens // self.block_size):
                errors.append(f"PRM entry {cid}: {len(e.blocks)} blocks for {e.n_tokens} tokens")
        return errors
