"""Final-answer rules and path-score aggregation."""
from __future__ import annotations

import pytest

from specscale.search.answer import aggregate, final_answers, group_answers


def test_aggregate():
    assert aggregate([0.9, 0.2, 0.7], "last") == 0.7
    assert aggregate([0.9, 0.2, 0.7], "min") == 0.2
    assert aggregate([0.5, 0.5], "prod") == pytest.approx(0.25)
    with pytest.raises(ValueError):
        aggregate([0.1], "mean")


def test_weighted_vote_sums_scores_of_equivalent_answers():
    eq = lambda a, b: float(a) == float(b)
    answers = ["0.5", "2", "1/2".replace("1/2", "0.50"), "2", None]
    scores = [0.6, 0.9, 0.5, 0.1, 1.0]
    fa = final_answers(answers, scores, eq)
    assert fa.weighted == "0.5"  # 0.6 + 0.5 = 1.1 > 0.9 + 0.1 = 1.0
    assert fa.best_single is None  # the single best path wrote no answer
    assert fa.majority == "0.5"  # 2 vs 2: the earlier group wins the tie
    assert group_answers(answers, eq) == [[0, 2], [1, 3]]


def test_no_finished_paths():
    fa = final_answers([], [], lambda a, b: a == b)
    assert fa.weighted is None and fa.best_single is None
