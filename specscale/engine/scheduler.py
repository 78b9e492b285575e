"""The scheduler: which physical sequences run in the next generation iteration.

It picks the rows (decode rows and prefill chunks) under the iteration's budgets of rows
(``EngineLimits.max_num_seqs``) and tokens (``max_num_batched_tokens``), re-attaches
cached prefix blocks to sequences with no KV, and preempts (recompute style) until the
KV pool holds the iteration's new tokens. Non-speculative work goes first; speculative
sequences are the first to wait and the first victims. The generation engine
(generation.py) runs the rows it returns and owns everything after the forward.
"""
from __future__ import annotations

from dataclasses import dataclass

from specscale.engine.backend import GenRow
from specscale.engine.block_manager import ROOT_HASH, BlockManager, chain_hash, chain_hashes
from specscale.engine.sequence import PhysicalSequence


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int = 1024  # physical rows per generation iteration
    max_num_batched_tokens: int = 8192  # tokens per generation iteration (decode rows + prefill chunks)
    block_size: int = 16


class Scheduler:
    def __init__(self, blocks: BlockManager, limits: EngineLimits, seqs: dict[int, PhysicalSequence]) -> None:
        self.blocks = blocks
        self.limits = limits
        self.seqs = seqs  # the generation engine's live sequences (the same dict)
        self.total_preemptions = 0
        self.prefix_hit_tokens = 0  # prefill tokens re-attached from the prefix cache instead of computed
        self.prefix_hit_blocks = 0
        self._reattached: dict[int, PhysicalSequence] = {}  # this iteration's re-attachments
        self.deferred_rows = 0  # rows the last iteration's row and token budgets left waiting

    def schedule(self) -> tuple[list[GenRow], list[GenRow], int]:
        """The next iteration's rows, those of them whose block tables must grow, and the
        sequences preempted to make room."""
        self._reattached.clear()
        return self._fit(self._candidates())

    def _candidates(self) -> list[GenRow]:
        """Every row that could run, cut to the iteration's row and token budgets."""
        rows: list[GenRow] = []
        total = 0
        caching = self.blocks.prefix_caching
        for seq in self.seqs.values():
            members = seq.members
            if caching and not seq.blocks and seq.num_cached == 0:
                # No KV at all: re-attach the cached prefix. Keep at least one token to
                # compute: a row with members needs the last token's logits, and a
                # prompt's prefill must run to report that the prompt is ready.
                if members:
                    self._reattach(seq, len(seq.tokens) - 1)
                elif seq.prefix_only:
                    self._reattach(seq, seq.target_cached - 1)
            if members:
                n = len(seq.tokens) - seq.num_cached
                if n <= 0:
                    raise RuntimeError(f"sequence {seq.sid} has members but nothing to compute")
                spec = members[0].position is None and (len(members) == 1 or all(m.position is None for m in members))
                rows.append(GenRow(seq, seq.num_cached, n, True, spec))  # (positional: the hot path)
                total += n
            elif seq.prefix_only and seq.num_cached < len(seq.tokens) - 1 and not seq.freed:
                n = len(seq.tokens) - 1 - seq.num_cached
                rows.append(GenRow(seq, seq.num_cached, n, False, False))
                total += n
        lim = self.limits
        if total <= lim.max_num_batched_tokens and len(rows) <= lim.max_num_seqs:
            self.deferred_rows = 0
            return rows
        # Over budget: non-speculative work first, then by admission; speculative work
        # is the first to wait. Prefill chunks are cut to the remaining token budget.
        rows.sort(key=lambda r: (r.speculative, r.seq.admit_order, r.seq.sid))
        kept: list[GenRow] = []
        budget = lim.max_num_batched_tokens
        for r in rows:
            if len(kept) >= lim.max_num_seqs or budget <= 0:
                break
            if r.n_new > budget:
                r.n_new = budget
                r.wants_logits = False
            budget -= r.n_new
            kept.append(r)
        self.deferred_rows = len(rows) - len(kept)
        return kept

    def _reattach(self, seq: PhysicalSequence, limit: int) -> None:
        """Give an empty table the cached full blocks of the history's first `limit` tokens.

        The blocks are looked up by chain hash in order, stopping at the first miss; hashes
        are computed once per block and kept on the sequence.
        """
        bs = self.blocks.block_size
        n = limit // bs
        if n <= 0:
            return
        hashes, tokens, lookup = seq.block_hashes, seq.tokens, self.blocks.lookup
        prev, hits = ROOT_HASH, 0
        for i in range(n):
            if i < len(hashes):
                h = hashes[i]
            else:  # hashed once, kept for later look-ups and for registration
                h = chain_hash(prev, tokens[i * bs: (i + 1) * bs])
                hashes.append(h)
            if lookup(h) is None:
                break  # the rest cannot hit: every later hash covers this block too
            prev, hits = h, i + 1
        table = self.blocks.reattach(hashes[:hits])
        if table:
            seq.blocks = table
            seq.num_cached = len(table) * bs
            seq.num_registered = len(table)
            self.prefix_hit_tokens += seq.num_cached
            self.prefix_hit_blocks += len(table)
            self._reattached[seq.sid] = seq

    def _undo_reattach(self, seq: PhysicalSequence) -> None:
        """Give back blocks re-attached this iteration to a sequence that will not run after
        all: nothing was computed on them, so it is no preemption (and no hit)."""
        del self._reattached[seq.sid]
        self.prefix_hit_tokens -= seq.num_cached
        self.prefix_hit_blocks -= len(seq.blocks)
        self.blocks.free(seq.blocks)
        seq.num_cached = 0
        seq.num_registered = 0

    def register(self, seq: PhysicalSequence) -> None:
        """Offer the sequence's newly computed full blocks to the prefix cache."""
        bs = self.blocks.block_size
        full = seq.num_cached // bs
        hashes = seq.block_hashes
        if len(hashes) < full:
            chain_hashes(seq.tokens, bs, full, hashes)
        register, table = self.blocks.register, seq.blocks
        for i in range(seq.num_registered, full):
            register(table[i], hashes[i])
        seq.num_registered = full

    def preempt(self, seq: PhysicalSequence) -> None:
        """Recompute-style preemption: drop the KV; the history is prefilled again later
        (from its cached prefix, with prefix caching)."""
        self.blocks.free(seq.blocks)
        if seq.num_cached > seq.recompute_until:
            seq.recompute_until = seq.num_cached
        seq.num_cached = 0
        seq.num_registered = 0
        seq.preemptions += 1
        self.total_preemptions += 1

    def _growth(self, rows: list[GenRow]) -> tuple[list[GenRow], int]:
        """The rows whose block tables grow (or copy a shared partial last block) to hold
        this iteration's new tokens, in order, and the blocks that takes. A decode row
        writing into its own partly filled block needs nothing: most rows, most iterations."""
        bs = self.blocks.block_size
        refcount, blocks_needed = self.blocks.refcount, self.blocks.blocks_needed
        grow: list[GenRow] = []
        total = 0
        for r in rows:
            seq = r.seq
            nc = seq.num_cached
            if r.n_new == 1 and nc % bs:  # decode inside a block: only copy-on-write
                if refcount[seq.blocks[nc // bs]] > 1:
                    total += 1
                    grow.append(r)
            else:
                need = blocks_needed(seq.blocks, nc, r.n_new)
                if need:
                    total += need
                    grow.append(r)
        return grow, total

    def _fit(self, rows: list[GenRow]) -> tuple[list[GenRow], list[GenRow], int]:
        """Preempt until the KV pool can hold this iteration's new tokens; returns the rows
        kept, those of them whose tables must grow (``_growth``) and the preemptions.

        Victims, in order: speculative sequences (scheduled or not), then idle
        sequences held for future forks (finished steps awaiting selection), then
        non-speculative running sequences; newest admission first within each class
        (LIFO, as vLLM). A preempted sequence drops its KV and recomputes it later.
        """
        grow, total = self._growth(rows)
        if total <= self.blocks.num_free:
            return rows, grow, 0
        preempted = 0
        by_seq = {r.seq.sid: r for r in rows}

        def rank(seq: PhysicalSequence) -> tuple:
            cls = 2 if seq.speculative else (1 if not seq.members else 0)  # rare path: recompute
            return (cls, seq.admit_order, seq.sid)

        victims = sorted((q for q in self.seqs.values() if q.blocks), key=rank)
        while total > self.blocks.num_free and victims and rows:
            victim = victims.pop()
            row = by_seq.pop(victim.sid, None)
            if row is not None:
                rows.remove(row)
            if victim.sid in self._reattached:
                self._undo_reattach(victim)
            else:
                self.preempt(victim)
                preempted += 1
            grow, total = self._growth(rows)
        while total > self.blocks.num_free and rows:  # rows that alone exceed the pool: defer some
            rows.remove(max(rows, key=lambda r: rank(r.seq)))
            grow, total = self._growth(rows)
        return rows, grow, preempted
