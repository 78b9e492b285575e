"""Strict early pruning never cancels a candidate full-information selection keeps."""
from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import given, settings

from specscale.search.selection import (
    kth_highest, select_top_k, shortcut_selection, strictly_below_threshold,
)


@dataclass(eq=False)
class Member:
    position: int
    score: float
    terminal: bool


# Scores from a small grid so ties (and exact 1.0) are frequent.
score = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0, 1.0])


@st.composite
def rounds(draw):
    n = draw(st.integers(1, 16))
    k = draw(st.integers(1, n))
    members = [Member(i, draw(score), draw(st.booleans()) and draw(st.booleans())) for i in range(n)]
    order = draw(st.permutations(range(n)))
    return k, members, order


@settings(max_examples=400, deadline=None)
@given(rounds())
def test_strict_pruning_never_cancels_a_selected_member(case):
    k, members, order = case
    final = set(map(id, select_top_k(members, k)))
    verified = []
    pruned = set()
    for i in order:  # scores arrive one by one in an arbitrary order
        m = members[i]
        if m.terminal:
            continue
        verified.append(m)
        for p in strictly_below_threshold(verified, k):
            pruned.add(id(p))
        assert not (pruned & final), "pruned a member the full-information selection keeps"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.integers(1, 20))
def test_threshold_only_rises(scores, k):
    seen, last = [], None
    for s in scores:
        seen.append(s)
        tau = kth_highest(seen, k)
        if last is not None:
            assert tau >= last
        if tau is not None:
            last = tau


def test_ties_at_threshold_survive():
    ms = [Member(0, 0.8, False), Member(1, 0.5, False), Member(2, 0.5, False)]
    assert strictly_below_threshold(ms, 2) == []  # tau = 0.5; both 0.5s may still win the tie
    ms.append(Member(3, 0.6, False))
    assert {m.position for m in strictly_below_threshold(ms, 2)} == {1, 2}


def test_selection_tie_break_is_position():
    ms = [Member(0, 0.7, False), Member(1, 0.9, False), Member(2, 0.9, False), Member(3, 0.95, True)]
    assert [m.position for m in select_top_k(ms, 2)] == [1, 2]
    assert [m.position for m in select_top_k(ms, 1)] == [1]


def test_shortcut_takes_earliest_verified_perfect_scores():
    ms = [Member(3, 1.0, False), Member(0, 0.5, False), Member(1, 1.0, False), Member(2, 1.0, False)]
    assert shortcut_selection(ms[:2], 2) is None
    assert [m.position for m in shortcut_selection(ms, 2)] == [3, 1]
