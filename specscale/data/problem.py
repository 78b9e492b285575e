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
    level:   the dataset's difficulty level where it has one (MATH-500's 1-5, arith's),
             else None; results carry it so accuracy can be read per level.
    """

    id: str
    problem: str
    answer: str
    source: str
    level: int | None = None
