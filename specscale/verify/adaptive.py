"""Adaptive verification: flush the PRM queue when leaving decisions unresolved costs
more than waiting saves (docs/paper.md §7, §12.4).

Lazy verification (docs/paper.md §6.3, Algorithm 3) flushes on fixed triggers: B_max
pending PRM tokens, a complete sibling group, d_max deferrals. Its best B_max belongs to
one model, workload and GPU, and past it throughput falls below no LV at all (paper Fig. 16). The
`adaptive` mode replaces the token threshold and the deferral count by a price
comparison, made once before every generation iteration; the sibling trigger, the
optional wall-clock age cap, the idle trigger and the memory trigger stay as separate
safeguards (the Server and ``VerifyQueue`` keep them).

The decision
------------
Before each generation iteration the scheduler either flushes the pending set P now,
or lets one more generation iteration run (duration Δ) and decides again. This is a
one-step look-ahead stopping rule: it is the optimal rule when the problem is monotone
(the cost of one more wait grows as speculative work piles up under the pending
tasks, and the saving of one more wait shrinks as the batch grows, see G below), which
is the regime that matters here. Every quantity is state the scheduler already has.

What waiting saves, G (batch efficiency). Let C(P) be the PRM seconds of a batch (the
PRM cost curve: the backend's cost model on the sim, a fit of the PRM batches timed
so far on torch, ``prm_curve.py``), n the pending PRM tokens and a the PRM tokens
expected to arrive during one generation iteration (a running mean of the tokens
enqueued per iteration). Flushed at size n, these tokens cost C(P)/n each; waiting one
iteration lets the batch grow to n + a and pay C(P+A)/(n+a) each. On the n + a tokens
of that batch the saving is

    G = (n + a) · C(P) / n  −  C(P + A).

For an affine curve C = α + β·n this is α·a/n: the fixed cost the arrivals help to
amortise, which falls as the batch grows. G ≤ 0 when the curve is linear or past its
knee: then waiting buys nothing and any cost at all flushes (a cheap flush never
waits); with no arrivals expected (a = 0), G = 0 as well.

What waiting costs, W + M.
- Waste W = (expected waste rate) × (expected wait). A pending task i whose round's
  membership is known has r_i live physical decode rows below it (its speculative
  descendants; a row shared with other lineages by CD counts by its member share) and
  is cancelled, with its subtree, with probability p_i. Its score is what would
  cancel them, so every iteration it waits, an expected p_i·r_i rows decode for
  nothing. A row-iteration costs Δ/R (R: rows per iteration, Δ: the iteration time;
  at a full batch a wasted row displaces a useful one). Hence
      W = Δ · Σ_i p_i r_i / R.
  A task whose round is still speculative gets p_i = 0: its score cannot cancel
  anything until its round opens (it is priced again then). With pruning off a score
  only cancels when it completes its round, so p_i = 0 while members still generate.
- Memory M. Under task i hang b_i KV blocks that its cancellation frees (its own
  held step and its descendants' steps). Σ p_i b_i blocks are expected to be tied to
  dead branches. They cost nothing while the pool has room; they cost rows when the
  next iteration needs more blocks than are free, for then the engine preempts
  (speculative work first, then held KV) and recomputes later. The pressure ρ is the
  probability of that: the blocks one iteration allocates are a count with mean D
  (a running mean of decode rows and prefill tokens over the block size), taken as
  Poisson, so ρ = P(demand > F) ≈ ½·erfc((F − D) / √(2D)) with F the free blocks. ρ
  is exactly 0 with room to spare (F − D beyond ~27·√(2D)) and → 1 past exhaustion.
  Each block is valued like one row-iteration (short of memory, one block is what a
  row needs to take its next tokens):
      M = ρ · Σ_i p_i b_i · Δ / R.

Flush when W + M ≥ G. With no speculative work (every r_i = 0, no doomed blocks) and
memory to spare, W = M = 0 < G as long as the PRM curve has a fixed cost and steps keep
arriving: the rule never fires and the queue flushes only on the sibling / idle /
memory triggers (and the age cap, if set).

p_i, with no oracle. Strict early pruning cancels a verified member that scores below
its round's threshold τ (the K-th highest verified non-terminal score). With τ known,
p_i = F̂(τ), the fraction of scores seen so far in this run strictly below τ (ties at τ
survive, as in the search). Before K members are verified (or before any score is
seen), p_i is the base rate of not being selected: 1 − K / (round members). The
synthetic workload's latent quality is never read.

This module is the pure rule. ``adaptive_monitor.py`` gathers its inputs from the
running scheduler.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from math import erfc, sqrt
from typing import Optional, Sequence


@dataclass(slots=True)  # built once per generation iteration: slots keep it cheap
class FlushState:
    """The quantities of one decision (units in brackets)."""

    pending_tokens: float  # n: PRM input tokens waiting [tokens]
    arrival_tokens: float  # a: PRM tokens expected during one generation iteration [tokens]
    flush_now_s: float  # C(P): PRM seconds of the pending batch [s]
    flush_later_s: float  # C(P + A): the same batch after one more iteration's arrivals [s]
    iteration_s: float  # Δ: expected generation iteration time [s]
    rows: float  # R: physical rows per generation iteration
    doomed_rows: float  # Σ p_i r_i: decode rows expected to be cancelled by the pending scores
    doomed_blocks: float  # Σ p_i b_i: KV blocks expected to be freed by them
    free_blocks: float  # F: free generator KV blocks
    block_demand: float  # D: blocks one generation iteration allocates


@dataclass(slots=True)
class FlushTerms:
    waste_s: float  # W
    memory_s: float  # M
    gain_s: float  # G

    @property
    def flush(self) -> bool:
        return self.waste_s + self.memory_s >= self.gain_s


def batch_gain(pending_tokens: float, arrival_tokens: float, flush_now_s: float, flush_later_s: float) -> float:
    """G = (n + a)·C(P)/n − C(P+A): what one more iteration of waiting saves the PRM."""
    if pending_tokens <= 0:
        return 0.0
    return (pending_tokens + arrival_tokens) * flush_now_s / pending_tokens - flush_later_s


def memory_pressure(free_blocks: float, block_demand: float) -> float:
    """ρ = P(next iteration needs more than the F free blocks), demand ~ Poisson(D) in its
    normal approximation: 0 with room to spare, ½ at F = D, → 1 past exhaustion."""
    if block_demand <= 0:
        return 0.0
    return 0.5 * erfc((free_blocks - block_demand) / sqrt(2.0 * block_demand))


def flush_terms(s: FlushState) -> FlushTerms:
    row_s = s.iteration_s / s.rows if s.rows > 0 else 0.0  # Δ / R: one row-iteration
    waste = s.doomed_rows * row_s
    memory = memory_pressure(s.free_blocks, s.block_demand) * s.doomed_blocks * row_s
    return FlushTerms(waste, memory, batch_gain(s.pending_tokens, s.arrival_tokens, s.flush_now_s, s.flush_later_s))


def should_flush(s: FlushState) -> bool:
    return flush_terms(s).flush


def cancel_probability(threshold: Optional[float], scores_sorted: Sequence[float], keep: int, members: int) -> float:
    """P(a pending member of a known round is cancelled): F̂(τ) from the run's scores when
    the round has a threshold, else the base rate 1 − K / members."""
    if threshold is not None and scores_sorted:
        return bisect_left(scores_sorted, threshold) / len(scores_sorted)  # strictly below τ
    if members <= 0:
        return 0.0
    return max(0.0, 1.0 - keep / members)
