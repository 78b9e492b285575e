"""Group equivalent final answers for the weighted (and majority) vote."""

from __future__ import annotations

from specscale.grading.equivalence import DEFAULT_TIMEOUT_S, cleaned_equivalent
from specscale.grading.normalize import clean_answer, fast_key


def group_equivalent(
    answers: list[str | None], timeout_s: float | None = DEFAULT_TIMEOUT_S
) -> list[list[int]]:
    """Partition answer indices into groups of equivalent answers.

    - Every index appears in exactly one group; groups are ordered by their first
      index and indices inside a group ascend, so the result depends only on the
      input list.
    - "No answer" (``None``, or a string that is empty after clean-up) forms its
      own single group and never joins a group of real answers. Callers decide
      whether that group may win a vote.
    - Each new answer is compared with the first member (the representative) of
      each existing group, in order, and joins the first match. Equivalence with a
      numeric tolerance is not transitive; comparing with representatives keeps
      the grouping deterministic. Identical canonical spellings skip the
      comparison entirely, so long lists with few distinct answers stay cheap.
    - ``timeout_s`` bounds each single comparison (see ``answers_equivalent``).
    """
    groups: list[list[int]] = []
    representatives: list[str | None] = []  # cleaned first member; None for the no-answer group
    group_of_key: dict[str, int] = {}
    no_answer_group: int | None = None

    for index, answer in enumerate(answers):
        cleaned = clean_answer(answer)
        if cleaned is None:
            if no_answer_group is None:
                no_answer_group = len(groups)
                groups.append([])
                representatives.append(None)
            groups[no_answer_group].append(index)
            continue

        key = fast_key(cleaned)
        target = group_of_key.get(key)
        if target is None:
            target = _find_group(cleaned, representatives, timeout_s)
        if target is None:
            target = len(groups)
            groups.append([])
            representatives.append(cleaned)
        group_of_key.setdefault(key, target)
        groups[target].append(index)
    return groups


def _find_group(cleaned: str, representatives: list[str | None], timeout_s: float | None) -> int | None:
    for group, representative in enumerate(representatives):
        if representative is None:
            continue
        first, second = sorted((representative, cleaned))  # same order as answers_equivalent
        if cleaned_equivalent(first, second, timeout_s):
            return group
    return None
