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


def test_returned_path_is_the_best_of_the_winning_group():
    from specscale.search.answer import returned_path

    eq = lambda a, b: a == b  # noqa: E731
    # "7" wins the vote (0.5 + 0.45 > 0.9); its best-scored path is index 2, not the overall best (1).
    assert returned_path(["7", "8", "7"], [0.45, 0.9, 0.5], eq) == 2
    # Score ties inside the group go to the earlier path.
    assert returned_path(["7", "7"], [0.5, 0.5], eq) == 0
    # No answers at all: the best-scored path.
    assert returned_path([None, None, None], [0.1, 0.7, 0.7], eq) == 1
    assert returned_path([], [], eq) is None


def test_output_tokens_are_the_returned_paths_tokens():
    from cfg_helpers import compose_cfg
    from specscale.cell import build_server

    s = build_server(compose_cfg("policy=nonspec", "beam=4", "seed=3"))
    rec = s.run()
    by_id = {r["request_id"]: r for r in rec.requests}
    for req in s.finished:
        ret = req.search.returned
        assert ret is not None and ret in req.search.final_paths
        assert by_id[req.request_id]["output_tokens"] == sum(len(c.step_tokens) for c in ret.path())
