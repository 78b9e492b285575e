"""The one record every dataset is mapped to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A math problem with its reference final answer.

    id:      stable within its source (survives sampling and re-ordering), used to
             pair results across policies and seeds.
    problem: the question text given to the generator.
    answer:  the reference FINAL answer (already extracted, e.g. "72" or
             "\\frac{1}{2}"), compared with ``specscale.grading.is_correct``.
    source:  the dataset's short name (``dataset.name`` in the config).
    """

    id: str
    problem: str
    answer: str
    source: str
