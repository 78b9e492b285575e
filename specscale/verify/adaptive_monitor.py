"""Gathers the inputs of the adaptive flush rule (``adaptive.py``) from a running
scheduler: the PRM cost curve, the run's scores, smoothed generation-iteration figures,
and, per decision, the decode rows and KV blocks hanging under each pending task.

Nothing here reads the synthetic workload: probabilities come from the scores the PRM
has returned so far and the rounds' thresholds (the search's own state).
"""
from __future__ import annotations

from bisect import insort
from typing import Any, Callable, Collection, Iterable, Optional, Sequence

from specscale.search.candidate import Candidate, Status
from specscale.search.selection import kth_highest
from specscale.verify.adaptive import FlushState, FlushTerms, cancel_probability, flush_terms, memory_pressure
from specscale.verify.prm_curve import Group, MeasuredPRMCurve, Task

# Weight of the newest iteration in the running means (Δ, R, a, D, task sizes): about
# the last ten iterations, a fraction of one reasoning step, so the means follow the
# load as requests arrive and finish without jumping with every burst of step ends.
SMOOTHING = 0.1


def _ewma(old: Optional[float], new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


def subtree_load(c: Candidate, block_size: int) -> tuple[float, float]:
    """(decode rows, KV blocks) that cancelling c's subtree would stop and free.

    Rows: running descendants' physical sequences, a sequence shared by several logical
    members (CD) counted by member share. Blocks: each descendant's current step, and c's
    own step while it holds KV or has children forked from it (they share those blocks).
    """
    rows = blocks = 0.0
    if c.holds_kv or c.children:
        blocks += -(-len(c.step_tokens) // block_size)
    stack = list(c.children.values())
    while stack:
        d = stack.pop()
        if d.status is Status.CANCELLED:
            continue
        seq = d.phys
        if d.status is Status.RUNNING and seq is not None and not seq.freed and seq.members:
            share = 1.0 / len(seq.members)
            rows += share
            blocks += share * -(-seq.step_pos // block_size)
        elif d.holds_kv or d.children:
            blocks += -(-len(d.step_tokens) // block_size)
        if d.children:
            stack.extend(d.children.values())
    return rows, blocks


_RUNNING = Status.RUNNING


def subtree_rows(c: Candidate) -> float:
    """The rows of ``subtree_load`` alone: the per-decision fast path while memory has room
    (then blocks carry no price and are not counted). A running candidate has no children
    yet, so only finished ones are descended into."""
    rows = 0.0
    for d in c.children.values():
        if d.status is _RUNNING:
            seq = d.phys
            if seq is not None and seq.members and not seq.freed:
                rows += 1.0 / len(seq.members)
        elif d.children:
            rows += subtree_rows(d)
    return rows


class AdaptiveMonitor:
    """State for the adaptive flush rule of one run."""

    def __init__(self, prm_cost: Optional[Callable[[Sequence[Task]], float]], block_size: int, keep: int,
                 pruning: str, profile: Sequence[tuple[int, float]] = (),
                 prm_cost_groups: Optional[Callable[[Sequence[Group]], float]] = None) -> None:
        self.measured_curve = MeasuredPRMCurve() if prm_cost is None else None
        if self.measured_curve is not None:
            for tokens, seconds in profile:  # the backend's start-up profile (torch), refined by the run's batches
                self.measured_curve.observe(tokens, seconds)
        self.prm_cost = prm_cost if prm_cost is not None else self.measured_curve
        # The batches priced every iteration are groups of equal tasks: price them as
        # (count, new, cached) groups where the curve allows (O(1) instead of O(tasks)).
        if prm_cost is None:
            prm_cost_groups = self.measured_curve.groups
        self.prm_cost_groups = prm_cost_groups or (
            lambda groups: self.prm_cost([(n, c) for k, n, c in groups for _ in range(int(k))]))
        self.block_size = block_size
        self.keep = keep
        self.pruning = pruning
        self.scores: list[float] = []  # every score returned so far in this run, sorted
        self.iteration_s: Optional[float] = None  # Δ
        self.rows: Optional[float] = None  # R
        self.arrival_tokens: Optional[float] = None  # a
        self.block_demand: Optional[float] = None  # D
        self.task_tokens: Optional[float] = None  # mean new PRM tokens of one task
        self.cached_tokens = 0.0  # mean cached PRM context of one task
        self.last: Optional[FlushTerms] = None  # the latest decision's terms (for inspection)
        # P(cancel) per (request, round): it moves only when scores arrive, i.e. at a PRM
        # batch, so it is kept between batches (the per-decision cost stays a walk of rows).
        self._p_of: dict[tuple[int, int], float] = {}
        self._now_memo: tuple[tuple, float] = ((), 0.0)  # C(P) of the last decision: P often did not change

    # ------------------------------------------------------------------ observations
    def on_generation(self, seconds: float, logit_rows: int, decode_rows: int, prefill_tokens: int,
                      enqueued_tokens: int) -> None:
        # Python floats: a backend may report numpy scalars, whose arithmetic costs ~10x
        # as much in the per-decision terms below.
        self.iteration_s = _ewma(self.iteration_s, float(seconds))
        self.rows = _ewma(self.rows, float(max(1, logit_rows)))
        self.arrival_tokens = _ewma(self.arrival_tokens, float(enqueued_tokens))
        self.block_demand = _ewma(self.block_demand, (decode_rows + prefill_tokens) / self.block_size)

    def on_prm_batch(self, items: Sequence[Any], seconds: float) -> None:
        """A PRM batch ran: its tasks' sizes, and its time for the measured curve."""
        tasks = [it for it in items if not it.prefix_only]
        if tasks:
            self.task_tokens = _ewma(self.task_tokens, sum(it.n_new for it in tasks) / len(tasks))
            self.cached_tokens = _ewma(self.cached_tokens, sum(it.n_cached for it in tasks) / len(tasks))
        if self.measured_curve is not None:
            self.measured_curve.observe(sum(it.n_new for it in items), seconds)
        self._p_of.clear()  # new scores, thresholds and rounds

    def on_scores(self, scores: Iterable[Optional[float]]) -> None:
        for s in scores:
            if s is not None:
                insort(self.scores, s)

    # ------------------------------------------------------------------ decision
    def decide(self, pending: Collection[Any], pending_tokens: int, search_of: Callable[[int], Any],
               free_blocks: int) -> bool:
        """Flush the pending tasks now? (Before any generation iteration ran: yes, there is
        no iteration time to price waiting with.)"""
        if self.iteration_s is None:
            return True
        self.last = flush_terms(self.state(pending, pending_tokens, search_of, free_blocks))
        return self.last.flush

    def state(self, pending: Collection[Any], pending_tokens: int, search_of: Callable[[int], Any],
              free_blocks: int) -> FlushState:
        demand = self.block_demand or 0.0
        priced_blocks = memory_pressure(free_blocks, demand) > 0.0  # blocks cost nothing with room to spare
        bs = self.block_size
        doomed_rows = doomed_blocks = 0.0
        p_of = self._p_of
        off = self.pruning == "off"
        for task in pending:
            for c in task.candidates:
                if c.position is None:
                    continue  # speculative round: its score cannot cancel anything yet
                key = (c.request_id, c.round)
                p = p_of.get(key)
                if p is None:
                    p = p_of[key] = self._cancel_probability(search_of(c.request_id), c.round)
                if p > 0.0 and off and search_of(c.request_id).rounds[c.round].unfinished > 0:
                    continue  # without early pruning a score cancels only by completing its round
                if p > 0.0:
                    if priced_blocks:
                        r, b = subtree_load(c, bs)
                        doomed_blocks += p * b
                    else:
                        r = subtree_rows(c)
                    doomed_rows += p * r
        # The PRM batch as tasks of the pending tasks' mean size on the mean cached context
        # (one list product instead of one tuple per task: this runs every iteration).
        k = len(pending)
        a = self.arrival_tokens or 0.0
        cached = self.cached_tokens
        now: list[Group] = [(k, pending_tokens / k, cached)] if k else []
        later = now
        if a > 0:
            n_new = max(1, int(a / (self.task_tokens or a) + 0.5))
            later = [*now, (n_new, a / n_new, cached)]
        key = (k, pending_tokens, cached, self.measured_curve.count if self.measured_curve is not None else 0)
        if self._now_memo[0] != key:
            self._now_memo = (key, float(self.prm_cost_groups(now)))
        return FlushState(
            pending_tokens=float(pending_tokens), arrival_tokens=a,
            flush_now_s=self._now_memo[1], flush_later_s=float(self.prm_cost_groups(later)),
            iteration_s=self.iteration_s or 0.0, rows=self.rows or 1.0,
            doomed_rows=doomed_rows, doomed_blocks=doomed_blocks,
            free_blocks=float(free_blocks), block_demand=demand,
        )

    def _cancel_probability(self, search: Any, round_index: int) -> float:
        if search is None or search.done or round_index >= len(search.rounds):
            return 0.0
        rd = search.rounds[round_index]
        if rd.resolved:
            return 0.0
        tau = kth_highest((m.score for m in rd.verified), self.keep)
        return cancel_probability(tau, self.scores, self.keep, len(rd.members))
