"""Grouping of equivalent answers for the weighted vote."""

from hypothesis import given, settings
from hypothesis import strategies as st

from specscale.grading import group_equivalent


def test_groups_half_forms_and_keeps_two_apart():
    groups = group_equivalent(["1/2", "0.5", "\\frac{1}{2}", "2"])
    assert groups == [[0, 1, 2], [3]]


def test_no_answer_never_joins_real_answers():
    answers = [None, "7", "", None, "7.0", "\\boxed{7}", "$$"]
    groups = group_equivalent(answers)
    assert groups == [[0, 2, 3, 6], [1, 4, 5]]


def test_groups_ordered_by_first_index_and_cover_every_index():
    answers = ["3", "1/2", "\\dfrac{1}{2}", "3.0", "x", "0.5"]
    groups = group_equivalent(answers)
    assert groups == [[0, 3], [1, 2, 5], [4]]


def test_empty_input():
    assert group_equivalent([]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["1/2", "0.5", "2", "2.0", "-2", None, "", "\\frac12", "x+1", "1+x"]), max_size=12))
def test_grouping_is_a_partition(answers):
    groups = group_equivalent(answers)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(answers)))
    assert all(g == sorted(g) for g in groups)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)


def test_weighted_vote_sums_equal_answers_written_differently():
    """The search's weighted vote with math-verify equivalence."""
    from specscale.grading import answers_equivalent
    from specscale.search.answer import final_answers

    answers = ["\\frac{1}{2}", "2", "0.5", "\\dfrac12", None]
    scores = [0.40, 0.90, 0.35, 0.30, 0.99]
    fa = final_answers(answers, scores, answers_equivalent)
    assert fa.weighted == "\\frac{1}{2}"  # 0.40 + 0.35 + 0.30 = 1.05 > 0.90
    assert fa.best_single is None  # the single best path has no answer
    assert fa.majority == "\\frac{1}{2}"
