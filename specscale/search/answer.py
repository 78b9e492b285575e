"""Path-score aggregation and final-answer rules (docs/design.md §2)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

Equivalent = Callable[[Any, Any], bool]


def aggregate(step_scores: Sequence[float], how: str) -> float:
    """Path score from per-step PRM rewards: last | min | prod."""
    if not step_scores:
        raise ValueError("a path needs at least one step score")
    if how == "last":
        return float(step_scores[-1])
    if how == "min":
        return float(min(step_scores))
    if how == "prod":
        return float(math.prod(step_scores))
    raise ValueError(f"unknown score aggregation {how!r}")


def group_answers(answers: Sequence[Any], equivalent: Equivalent) -> list[list[int]]:
    """Indices grouped by answer equivalence; None ("no answer") is never grouped.

    Each answer joins the first group whose representative it is equivalent to, so
    the grouping is deterministic in the order of `answers`.
    """
    groups: list[list[int]] = []
    for i, a in enumerate(answers):
        if a is None:
            continue
        for g in groups:
            if equivalent(answers[g[0]], a):
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


@dataclass(frozen=True)
class FinalAnswers:
    weighted: Optional[Any]
    best_single: Optional[Any]
    majority: Optional[Any]


def final_answers(answers: Sequence[Any], scores: Sequence[float], equivalent: Equivalent) -> FinalAnswers:
    """Weighted vote (largest summed score), best single path, plain majority.

    Ties between groups go to the group whose first member comes first, so the
    result depends only on the (deterministic) order of the finished paths.
    """
    if len(answers) != len(scores):
        raise ValueError("answers and scores differ in length")
    if not answers:
        return FinalAnswers(None, None, None)
    groups = group_answers(answers, equivalent)
    best = max(range(len(answers)), key=lambda i: (scores[i], -i))
    if not groups:
        return FinalAnswers(None, answers[best], None)
    weighted = max(groups, key=lambda g: (sum(scores[i] for i in g), -g[0]))
    majority = max(groups, key=lambda g: (len(g), -g[0]))
    return FinalAnswers(answers[weighted[0]], answers[best], answers[majority[0]])


def returned_path(answers: Sequence[Any], scores: Sequence[float], equivalent: Equivalent) -> Optional[int]:
    """Index of the path whose answer a request returns (its response, docs/design.md §5):
    the best-scored path of the weighted-vote group; the best-scored path overall when
    no path has an answer; None when there are no paths. Score ties go to the earlier
    path, as everywhere in the search."""
    if len(answers) != len(scores):
        raise ValueError("answers and scores differ in length")
    if not answers:
        return None
    groups = group_answers(answers, equivalent)
    members = range(len(answers))
    if groups:
        members = max(groups, key=lambda g: (sum(scores[i] for i in g), -g[0]))
    return max(members, key=lambda i: (scores[i], -i))
