"""The searches as data: what each search selects, prunes and expands (docs/design.md §2.1).

One controller (controller.py) runs every search; a rule answers its search-specific
questions, from lineage and scores only (never timing, never tensors):

- which group a new child belongs to (a DVTS subtree; one group elsewhere);
- how many parents one group keeps (`quota`, the K of early pruning), which verified
  members can no longer be kept (`unselectable`) and what the perfect-score shortcut may
  close (`shortcut`), both within the member's group;
- once a round is decided: which members it selected and how many children each gets
  (`decide`); no children means the search is finished;
- whether a member's child starts as soon as its step ends, selection or not
  (`step_end_children`: best-of-N continues every path).

Reference semantics: huggingface/search-and-learn (src/sal/search/beam_search.py,
best_of_n.py, diverse_verifier_tree_search.py) for beam, best_of_n and dvts; the REBASE
paper (Wu et al. 2024, "Inference Scaling Laws", reward-balanced search) for rebase.
Where this harness deviates, and why:

- All searches are step-wise: every step of every path is scored by the PRM (path score
  `search.score_agg`), where search-and-learn's best-of-N samples whole completions and
  scores each once. With the PRM prefix cache a step's task computes only its new piece,
  so the PRM work is about one pass over each path plus the closing tokens per step.
- Finished paths and the answer follow docs/design.md §2 for every search (weighted vote
  over all finished paths, ties by order), not search-and-learn's per-search pick (the
  best path, or the last expansion's children in DVTS).
- dvts: one subtree is exactly beam search with beam = expansion = M and K = 1. Its
  terminal members join the finished pool, its best non-terminal member goes on, and it
  ends when it holds M finished paths or no non-terminal member. search-and-learn instead
  ends a subtree as soon as its best child is terminal and returns that subtree's last M
  children; the rule here is what makes DVTS with one subtree equal beam search. Subtree g
  is the root's children g*M .. g*M+M-1, as search-and-learn's n / beam_width beams. The
  subtrees advance in lockstep rounds (one generate-and-score iteration at a time, as there),
  so one round record holds every live subtree; early pruning and the shortcut act per
  subtree with K = 1, and a round closes once every subtree is decided.
- best_of_n: a path's next step never depends on a score, so a member's child starts as soon
  as its step ends, under every policy (no round barrier on generation). Rounds are still
  recorded: round r holds the r-th step of every path still going, it resolves once all of
  them are scored, its selection is every non-terminal member (in position order) with one
  child each. Children that run ahead of an unresolved round have no position yet, so the
  scheduler treats them as speculative work (deprioritised, preempted first).
- rebase: the budget each round is N minus the paths finished so far (REBASE's remaining
  width) and it is split by softmax(score / search.rebase_temperature) over the round's
  non-terminal members, rounded by largest remainder with ties to the lower position (the
  REBASE code rounds up greedily, best first), so the total is exactly the budget and the
  split depends on scores and lineage only. Members given 0 children are discarded. A
  path ends at EOS or a cap (docs/design.md §2), where REBASE's code looks for an answer
  phrase in the text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from specscale.settings.search_policy import SearchConfig
from specscale.search.selection import select_top_k, shortcut_selection, strictly_below_threshold


@dataclass(frozen=True)
class Decision:
    """What a decided round hands on."""

    selected: list  # recorded as the round's selection (selected_keys), in the rule's order
    children: list  # (parent, child count) in position order; empty: the search is finished


@dataclass(frozen=True)
class BeamRule:
    """PRM beam search (docs/design.md §2): the top K = N / M members, M children each."""

    beam: int  # N
    expansion: int  # M
    max_rounds: int
    step_end_children = 0  # a child waits for its parent's selection (or speculation)

    @property
    def quota(self) -> Optional[int]:
        """Parents one group keeps: the K of early pruning (None: nothing to prune for)."""
        return self.beam // self.expansion

    def group_of_child(self, parent: Any, j: int) -> int:
        return parent.group

    def peers(self, verified: Sequence, c: Any) -> Sequence:
        """The verified members c competes with for selection."""
        return verified

    def unselectable(self, verified: Sequence, c: Any) -> list:
        """Verified members of c's group that can no longer be selected (strict pruning)."""
        return strictly_below_threshold(self.peers(verified, c), self.quota)

    def shortcut(self, verified: Sequence, c: Any) -> Optional[list]:
        """The perfect-score selection that closes c's group now, or None."""
        return shortcut_selection(self.peers(verified, c), self.quota)

    def last_round(self, index: int) -> bool:
        return index >= self.max_rounds - 1

    def decide(self, index: int, members: Sequence, closed: Mapping[int, list], finished: Sequence) -> Decision:
        """members: the round in position order; closed: group -> the shortcut's selection;
        finished: the finished pool with this round's terminal members in it."""
        selected = closed[0] if 0 in closed else select_top_k(members, self.quota)
        if len(finished) >= self.beam or not selected or self.last_round(index):
            return Decision(selected, [])
        return Decision(selected, [(p, self.expansion) for p in sorted(selected, key=lambda m: m.position)])


@dataclass(frozen=True)
class DvtsRule(BeamRule):
    """N / M subtrees, each a beam search with beam = M, K = 1 (see the module docstring)."""

    @property
    def quota(self) -> Optional[int]:
        return 1

    def group_of_child(self, parent: Any, j: int) -> int:
        return j // self.expansion if parent.round < 0 else parent.group

    def peers(self, verified: Sequence, c: Any) -> Sequence:
        return [m for m in verified if m.group == c.group]

    def decide(self, index: int, members: Sequence, closed: Mapping[int, list], finished: Sequence) -> Decision:
        done: dict[int, int] = {}
        for m in finished:
            done[m.group] = done.get(m.group, 0) + 1
        groups: dict[int, list] = {}
        for m in members:  # position order keeps the subtrees in order (each is contiguous)
            groups.setdefault(m.group, []).append(m)
        selected, children = [], []
        for g, ms in groups.items():
            chosen = closed[g] if g in closed else select_top_k([m for m in ms if m.score is not None], 1)
            selected.extend(chosen)
            if chosen and done.get(g, 0) < self.expansion and not self.last_round(index):
                children.append((chosen[0], self.expansion))
        return Decision(selected, children)


@dataclass(frozen=True)
class BestOfNRule(BeamRule):
    """N independent paths: every non-terminal member gets one child, nothing is pruned."""

    step_end_children = 1  # continuing a path never waits for a score

    @property
    def quota(self) -> Optional[int]:
        return None

    def unselectable(self, verified: Sequence, c: Any) -> list:
        return []

    def shortcut(self, verified: Sequence, c: Any) -> Optional[list]:
        return None

    def decide(self, index: int, members: Sequence, closed: Mapping[int, list], finished: Sequence) -> Decision:
        going = [m for m in members if m.live and not m.terminal]
        if self.last_round(index):
            return Decision(going, [])
        return Decision(going, [(m, 1) for m in going])


@dataclass(frozen=True)
class RebaseRule(BestOfNRule):
    """REBASE: the remaining width shared by softmax(score / T) (see the module docstring)."""

    temperature: float = 0.2
    step_end_children = 0  # a member's child count is known only once its round is decided

    def decide(self, index: int, members: Sequence, closed: Mapping[int, list], finished: Sequence) -> Decision:
        going = [m for m in members if m.live and not m.terminal]
        budget = self.beam - len(finished)
        if budget <= 0 or not going or self.last_round(index):
            return Decision([], [])
        counts = rebase_allocation([m.score for m in going], budget, self.temperature)
        plan = [(m, n) for m, n in zip(going, counts) if n > 0]
        return Decision([m for m, _ in plan], plan)


def rebase_allocation(scores: Sequence[float], budget: int, temperature: float) -> list[int]:
    """Children per member: budget * softmax(score / temperature), rounded by largest
    remainder (ties to the lower index) so the counts sum to the budget exactly."""
    if budget <= 0 or not scores:
        return [0] * len(scores)
    top = max(scores)  # shifted, so exp never overflows; the shares are unchanged
    weights = [math.exp((s - top) / temperature) for s in scores]
    total = sum(weights)
    quotas = [budget * w / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    left = budget - sum(counts)
    # left < len(scores) (it is the sum of the fractional parts), so the counts sum to the budget.
    for i in sorted(range(len(scores)), key=lambda i: (counts[i] - quotas[i], i))[:left]:
        counts[i] += 1
    return counts


def rule_for(cfg: SearchConfig) -> BeamRule:
    """The rule of cfg.kind (validated by SearchConfig)."""
    if cfg.kind == "rebase":
        return RebaseRule(cfg.beam, cfg.expansion, cfg.max_rounds, temperature=cfg.rebase_temperature)
    cls = {"beam": BeamRule, "dvts": DvtsRule, "best_of_n": BestOfNRule}[cfg.kind]
    return cls(cfg.beam, cfg.expansion, cfg.max_rounds)
