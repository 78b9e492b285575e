"""Answer extraction and equivalence for grading and for the answer vote.

Public API:
    extract_boxed(text) -> str | None
    extract_gsm8k_reference(text) -> str | None
    answers_equivalent(a, b, timeout_s=5.0) -> bool
    is_correct(predicted, reference, timeout_s=5.0) -> bool
    group_equivalent(answers, timeout_s=5.0) -> list[list[int]]
"""

from specscale.grading.equivalence import DEFAULT_TIMEOUT_S, answers_equivalent, is_correct
from specscale.grading.extract import extract_boxed, extract_gsm8k_reference
from specscale.grading.grouping import group_equivalent

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "answers_equivalent",
    "extract_boxed",
    "extract_gsm8k_reference",
    "group_equivalent",
    "is_correct",
]
