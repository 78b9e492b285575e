"""Selection rules of one round as pure functions (docs/design.md §2-3, docs/paper.md §4.4,
Algorithm 1).

Scores are immutable once verified, so the K-th highest verified score can only rise
as more scores arrive: a verified member strictly below it can never be selected.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Sequence

PERFECT = 1.0


def select_top_k(members: Sequence, k: int) -> list:
    """Top-k non-terminal members by score, ties broken by lower position.

    `members` need .score, .position and .terminal. Returned best first.
    """
    pool = [m for m in members if not m.terminal]
    return sorted(pool, key=lambda m: (-m.score, m.position))[:k]


def kth_highest(scores: Iterable[float], k: int) -> float | None:
    """The k-th largest value, or None when fewer than k values exist."""
    top = heapq.nlargest(k, scores)
    return top[-1] if len(top) >= k else None


def strictly_below_threshold(verified: Sequence, k: int) -> list:
    """Verified non-terminal members that can no longer be selected (s < tau)."""
    tau = kth_highest((m.score for m in verified), k)
    if tau is None:
        return []
    return [m for m in verified if m.score < tau]


def shortcut_selection(verified_in_order: Sequence, k: int) -> list | None:
    """First k verified non-terminal members with a perfect score, or None.

    Earlier verification wins: the shortcut trades the baseline's position tie-break
    for not waiting on members that could at best tie.
    """
    perfect = [m for m in verified_in_order if m.score == PERFECT]
    return perfect[:k] if len(perfect) >= k else None
