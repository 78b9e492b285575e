"""Generation side of the engine: physical sequences, CD grouping, forks, KV, sampling.

One call to `step()` is one generation iteration: every runnable physical sequence
advances (decode: one token; prefill: a chunk), the backend computes logits for the
rows that end at their history's end, every logical member draws its own token with
the paired sampler, members are partitioned by token and the sequence forks where
draws differ (docs/paper.md §5.4, Algorithm 2).

Prefix caching (``BlockManager.prefix_caching``): after the forward that fills a block,
the block is registered under the chain hash of the history up to its end. A sequence
about to run with no KV at all (preempted, a fork of a preempted parent, a new prompt)
first re-attaches the cached full blocks of its history, in order up to the first miss,
and prefills only the rest. Preemption therefore costs the partial last block, not the
whole history, and forks keep sharing their prefix after it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from specscale.engine.backend import Backend, BackendBase, GenBatch, resolve_seconds
from specscale.engine.block_manager import BlockManager, chain_hashes
from specscale.hashing import roll_np
from specscale.engine.sampler import SamplingParams, sample_rows
from specscale.engine.scheduler import EngineLimits, Scheduler
from specscale.engine.sequence import PhysicalSequence, history_hash
from specscale.search.candidate import Candidate, Status, step_end_reason


class KVCapacityError(RuntimeError):
    """The KV pool cannot hold even one runnable sequence."""


@dataclass
class StepResult:
    seconds: float  # the forward's duration, resolved to a float before step() returns
    decode_rows: int
    prefill_tokens: int
    logit_rows: int
    draws: int  # logical members that drew a token
    speculative_rows: int
    forks: int
    preempted: int
    rows: int = 0  # rows scheduled (decode rows and prefill chunks): what engine.max_num_seqs caps
    deferred_rows: int = 0  # rows that could have run but waited for the row or token budget
    finished: list[tuple[PhysicalSequence, list[Candidate]]] = field(default_factory=list)
    prefixes_done: list[PhysicalSequence] = field(default_factory=list)


class GenerationEngine:
    def __init__(
        self,
        backend: Backend,
        blocks: BlockManager,
        sampling: SamplingParams,
        limits: EngineLimits,
        step_token_cap: int,
        path_token_cap: int,
        dedup: bool,
    ) -> None:
        self.backend = backend
        self.blocks = blocks
        self.sampling = sampling
        self.limits = limits
        self.step_token_cap = step_token_cap
        self.path_token_cap = path_token_cap
        self.dedup = dedup
        # A path also ends (terminal, like the path cap) when its history fills the
        # generator's context window; backends without a window never hit it.
        self.max_len = backend.max_model_len or 1 << 62
        self.seqs: dict[int, PhysicalSequence] = {}  # live sequences (running or held)
        self._fresh: dict[int, PhysicalSequence] = {}  # source sid -> CD fork not yet run
        self._sid = itertools.count()
        self.scheduler = Scheduler(blocks, limits, self.seqs)
        self.recomputed_prefill_tokens = 0  # tokens computed again because their KV was lost to preemption

    @property
    def total_preemptions(self) -> int:
        return self.scheduler.total_preemptions

    @property
    def prefix_hit_tokens(self) -> int:
        return self.scheduler.prefix_hit_tokens

    @property
    def prefix_hit_blocks(self) -> int:
        return self.scheduler.prefix_hit_blocks

    # ------------------------------------------------------------------ placement
    def add_prompt(self, request_id: int, admit_order: int, prompt: list[int]) -> PhysicalSequence:
        if not prompt:
            raise ValueError(f"request {request_id}: empty prompt")
        seq = PhysicalSequence(
            sid=next(self._sid), request_id=request_id, admit_order=admit_order,
            tokens=list(prompt), hist_hash=history_hash(prompt), prefix_only=True,
        )
        self.seqs[seq.sid] = seq
        return seq

    def _fork(self, parent: PhysicalSequence) -> PhysicalSequence:
        seq = PhysicalSequence(
            sid=next(self._sid), request_id=parent.request_id, admit_order=parent.admit_order,
            tokens=list(parent.tokens), hist_hash=parent.hist_hash, num_cached=parent.num_cached,
            blocks=self.blocks.fork(parent.blocks, parent.num_cached),
            step_pos=parent.step_pos, n_steps=parent.n_steps,
            block_hashes=list(parent.block_hashes) if parent.block_hashes else [],
            num_registered=parent.num_registered, recompute_until=parent.recompute_until,
        )
        self.seqs[seq.sid] = seq
        return seq

    def start_children(self, parent: Candidate, children: list[Candidate], now: float) -> None:
        """Place new logical children on physical sequences forked from the parent's."""
        src: PhysicalSequence = parent.phys
        if src is None or src.freed:
            raise RuntimeError(f"candidate {parent.cid}: children started after its KV was released")
        step_start = len(src.tokens)
        if self.dedup:
            # Identical history: one sequence for all; reuse a fork made this iteration
            # by another parent with the same text (CD across lineages).
            target = self._fresh.get(src.sid)
            if target is None or target.freed:
                target = self._fork(src)
                target.step_pos = 0
                self._fresh[src.sid] = target
            groups = [(target, children)]
        else:
            groups = []
            for child in children:
                seq = self._fork(src)
                seq.step_pos = 0
                groups.append((seq, [child]))
        for seq, kids in groups:
            for c in kids:
                c.phys = seq
                c.step_start = step_start
                c.status = Status.RUNNING
                c.start_time = now
                seq.members.append(c)

    def remove_member(self, c: Candidate) -> None:
        seq: PhysicalSequence = c.phys
        if seq is None:
            return
        if c.status is Status.RUNNING and c in seq.members:
            seq.members.remove(c)
        if c.holds_kv:
            c.holds_kv = False
            seq.holders -= 1
        self._maybe_free(seq)

    def _maybe_free(self, seq: PhysicalSequence) -> None:
        if seq.freed or seq.members or seq.holders > 0:
            return
        if seq.prefix_only and seq.num_cached < seq.target_cached:
            return  # the prompt is still being prefilled
        self.blocks.free(seq.blocks)
        seq.freed = True
        del self.seqs[seq.sid]

    # ------------------------------------------------------------------ scheduling
    def has_work(self) -> bool:
        return any(s.runnable for s in self.seqs.values())

    # ------------------------------------------------------------------ one iteration
    def step(self) -> StepResult:
        self._fresh.clear()  # forks that run this iteration may diverge: no more merging
        rows, grow, preempted = self.scheduler.schedule()
        if not rows:
            held = self.blocks.num_blocks - self.blocks.num_free
            raise KVCapacityError(
                f"KV pool of {self.blocks.num_blocks} blocks of {self.blocks.block_size} tokens cannot fit the next "
                f"step of any sequence ({self.blocks.num_free} free, {held} held by {len(self.seqs)} sequences): "
                "raise engine.kv_blocks (engine=torch on CPU: engine.cpu_kv_blocks; null sizes the pool from "
                "memory), or lower search.path_token_cap / dataset prompt length"
            )
        copies: list[tuple[int, int]] = []
        append = self.blocks.append
        for r in grow:  # (the other rows' tables already hold their new tokens)
            copies.extend(append(r.seq.blocks, r.seq.num_cached, r.n_new))
        # On CUDA ``pending`` is still being measured by the device; it is resolved below,
        # after the draw, whose copy of the token ids has waited for the forward anyway.
        logits, pending = self.backend.forward(GenBatch(rows, copies))
        result = StepResult(
            seconds=0.0, decode_rows=0, prefill_tokens=0, logit_rows=0, draws=0,
            speculative_rows=0, forks=0, preempted=preempted, rows=len(rows),
            deferred_rows=self.scheduler.deferred_rows,
        )
        logit_seqs: list[PhysicalSequence] = []
        caching, bs = self.blocks.prefix_caching, self.blocks.block_size
        decode = prefill = speculative = 0  # counted locally: this loop runs once per row
        for r in rows:
            seq, start, n = r.seq, r.start, r.n_new
            if start < seq.recompute_until:  # KV this history had before a preemption
                self.recomputed_prefill_tokens += min(start + n, seq.recompute_until) - start
            cached = seq.num_cached = seq.num_cached + n
            if caching and cached >= (seq.num_registered + 1) * bs:
                self.scheduler.register(seq)  # before _draw: forks made there inherit num_registered
            if n == 1 and start > 0:
                decode += 1
            else:
                prefill += n
            if r.speculative:
                speculative += 1
            if r.wants_logits:
                logit_seqs.append(seq)
            elif seq.prefix_only and cached == seq.target_cached:
                result.prefixes_done.append(seq)
        result.decode_rows, result.prefill_tokens, result.speculative_rows = decode, prefill, speculative
        result.logit_rows = len(logit_seqs)
        if logit_seqs:
            self._draw(logits, logit_seqs, result)
        # The iteration's one synchronisation is behind us (the draw's token-id copy) or is
        # this resolve (no logit rows, or logits the backend made on the host): either way
        # the forward's device work has finished when step() returns (server/clock.py).
        result.seconds = resolve_seconds(pending)
        return result

    def _draw(self, logits, seqs: list[PhysicalSequence], result: StepResult) -> None:
        keys = [m.key for seq in seqs for m in seq.members]  # (every logit row has members)
        if len(keys) == len(seqs):  # no CD group to split: one draw per row
            member_rows = np.arange(len(seqs), dtype=np.int64)
            idx = [seq.step_pos for seq in seqs]
        else:
            member_rows, idx = [], []
            for i, seq in enumerate(seqs):
                n, pos = len(seq.members), seq.step_pos
                member_rows.extend([i] * n)
                idx.extend([pos] * n)
            member_rows = np.asarray(member_rows, dtype=np.int64)
        drawn = sample_rows(
            logits, member_rows, np.asarray(keys, dtype=np.uint64), np.asarray(idx, dtype=np.uint64), self.sampling,
        )
        tokens = drawn.tolist()
        result.draws = len(tokens)
        # The draw's targets and their tokens; a target's members are its group (forks are
        # made, and copy the history, before any target appends its token).
        if len(tokens) == len(seqs):  # one draw per row, onto the row itself
            targets, placed = seqs, drawn
        else:
            targets, placed, pos = [], [], 0
            for seq in seqs:
                n = len(seq.members)
                if n == 1:
                    targets.append(seq)
                    placed.append(tokens[pos])
                else:
                    for target, token in self._partition(seq, seq.members, tokens[pos: pos + n], result):
                        targets.append(target)
                        placed.append(token)
                pos += n
            tokens = placed
        # Every target's history hash rolled by its token at once (numpy uint64 wraps
        # modulo 2**64 like the masked Python ints of ``roll``: the same hashes).
        hashes = roll_np(np.fromiter((t.hist_hash for t in targets), dtype=np.uint64, count=len(targets)),
                         np.asarray(placed, dtype=np.uint64)).tolist()
        eos, delim = self.backend.eos_ids, self.backend.delimiter_ids
        step_cap, path_cap, max_len = self.step_token_cap, self.path_token_cap, self.max_len
        finished = result.finished
        for target, token, h in zip(targets, tokens, hashes):
            group = target.members
            target.tokens.append(token)  # target.append(token), with the hash rolled above
            target.hist_hash = h
            step_pos = target.step_pos = target.step_pos + 1
            path_len = group[0].path_tokens_before + step_pos
            # step_end_reason's common "goes on" case, inlined: this loop runs once per draw.
            if (path_len < path_cap and step_pos < step_cap and token not in eos and token not in delim
                    and len(target.tokens) < max_len):
                continue
            reason = step_end_reason(token, eos, delim, path_len, path_cap, len(target.tokens), max_len, step_pos,
                                     step_cap)
            self._finish_step(target, group, reason)
            finished.append((target, group))

    def _partition(self, seq, members, drawn, result: StepResult):
        """(target, token) per distinct draw: members grouped by token (first-seen order),
        each group the members of its target; forks where draws differ.

        Forks copy the history before any group appends its token.
        """
        groups: dict[int, list[Candidate]] = {}
        for m, t in zip(members, drawn):
            groups.setdefault(t, []).append(m)
        placed = []
        for token, group in groups.items():
            if not placed:
                target = seq
            else:
                target = self._fork(seq)
                for m in group:
                    m.phys = target
                result.forks += 1
            target.members = group
            placed.append((target, token))
        return placed

    def _finish_step(self, seq: PhysicalSequence, group: list[Candidate], reason: str) -> None:
        for m in group:
            m.step_tokens = seq.tokens[m.step_start:]
            m.end_reason = reason
            m.end_hash = seq.hist_hash
            m.status = Status.DONE
            m.holds_kv = True
        seq.holders += len(group)
        seq.members = []
        seq.n_steps += 1
        seq.step_pos = 0

    # ------------------------------------------------------------------ accounting
    def kv_errors(self) -> list[str]:
        """Violations of the KV bookkeeping invariants (empty when consistent).

        Every block's reference count equals the number of live sequences whose table
        holds it; every live sequence is needed by someone (a running member, a
        finished holder, or an unfinished prompt prefill); no cancelled candidate
        keeps anything.
        """
        errors = self.blocks.reference_errors((seq.blocks for seq in self.seqs.values()), "sequences")
        for seq in self.seqs.values():
            needed = seq.members or seq.holders > 0 or (seq.prefix_only and seq.num_cached < seq.target_cached)
            if not needed:
                errors.append(f"sequence {seq.sid} is alive but nobody needs it")
            for m in seq.members:
                if m.status is not Status.RUNNING:
                    errors.append(f"sequence {seq.sid} runs candidate {m.cid} in status {m.status}")
        errors.extend(self.blocks.errors())
        errors.extend(self._prefix_cache_errors())
        return errors

    def _prefix_cache_errors(self) -> list[str]:
        """Every hashed block a live sequence holds is a full, computed block of its history
        at that index, hashed from the history's tokens (recomputed here, independently of
        the hashes the sequence keeps); tables cover exactly the computed tokens."""
        errors = []
        bs, hash_of = self.blocks.block_size, self.blocks.hash_of
        for seq in self.seqs.values():
            if len(seq.blocks) != -(-seq.num_cached // bs):
                errors.append(f"sequence {seq.sid}: {len(seq.blocks)} blocks for {seq.num_cached} cached tokens")
            full = seq.num_cached // bs
            hashed = [i for i, b in enumerate(seq.blocks) if hash_of(b) is not None]
            if hashed and hashed[-1] >= full:
                errors.append(f"sequence {seq.sid}: partial block {seq.blocks[hashed[-1]]} is hashed")
            if seq.num_registered > full:
                errors.append(f"sequence {seq.sid}: {seq.num_registered} blocks registered, {full} full")
            n = min(max(len(seq.block_hashes), hashed[-1] + 1 if hashed else 0), len(seq.tokens) // bs)
            if not n:
                continue
            want = chain_hashes(seq.tokens, bs, n)
            if seq.block_hashes[:n] != want[: len(seq.block_hashes)]:
                errors.append(f"sequence {seq.sid}: kept block hashes do not match its tokens")
            for i in hashed:
                if i < n and hash_of(seq.blocks[i]) != want[i]:
                    errors.append(f"sequence {seq.sid}: block {seq.blocks[i]} (index {i}) holds another history's hash")
        return errors

    def running_logical(self) -> int:
        return sum(len(s.members) for s in self.seqs.values())

    def live_sequences(self) -> int:
        return len(self.seqs)


class ScheduledBackend(BackendBase):
    """A backend the harness schedules (sim, torch): its ``forward`` runs the rows that
    ``GenerationEngine`` picks, over a KV pool the harness accounts for."""

    def make_generation_side(self, sampling: SamplingParams, limits: EngineLimits, step_token_cap: int,
                             path_token_cap: int, dedup: bool, *, kv_blocks: int | None,
                             prefix_caching: bool) -> GenerationEngine:
        """kv_blocks: the pool's size (None = the backend's own, ``kv_blocks(block_size)``)."""
        n_blocks = kv_blocks if kv_blocks is not None else self.kv_blocks(limits.block_size)
        blocks = BlockManager(n_blocks, limits.block_size, prefix_caching=prefix_caching)
        return GenerationEngine(self, blocks, sampling, limits, step_token_cap, path_token_cap, dedup)
