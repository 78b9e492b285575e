"""Column mappings: one dataset row -> ``Problem``.

Schemas relied on (hub datasets as published; fixtures mirror them):

gsm8k          ``openai/gsm8k`` config ``main``, split ``test`` (1,319 rows):
               question: str, answer: str (worked solution ending "#### <number>").
               id = "<split>/<row index>"; reference = the number after "####",
               commas removed.
math500        ``HuggingFaceH4/MATH-500`` split ``test`` (500 rows):
               problem, solution, answer, subject, level (int), unique_id
               ("test/<subject>/<n>.json"). id = unique_id; reference = answer
               (falls back to the last \\boxed{} of the solution if empty).
olympiadbench  ``Hothan/OlympiadBench`` config ``OE_TO_maths_en_COMP`` (open-ended,
               text-only, maths, English, competition; 675 rows, only split
               ``train``): id (int), question, solution (list[str]),
               final_answer (list[str], each usually wrapped in $...$), context
               (str|null), is_multiple_answer, unit, answer_type, subfield,
               modality, language, ... id = str(id); problem = context + question
               when a context is given; reference = the final_answer items with
               their $ delimiters removed, joined by ", " (several items mean a
               multi-part answer).

A row whose reference cannot be found is skipped by the loader (it cannot be
graded); every mapper returns None for it instead of raising.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from specscale.data.problem import Problem
from specscale.grading.extract import extract_boxed, extract_gsm8k_reference

Row = Mapping[str, Any]
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def gsm8k_problem(row: Row, index: int, split: str, source: str) -> Problem | None:
    answer = extract_gsm8k_reference(row.get("answer"))
    if answer is None:
        return None
    return Problem(id=f"{split}/{index}", problem=str(row["question"]).strip(), answer=answer, source=source)


def math500_problem(row: Row, index: int, split: str, source: str) -> Problem | None:
    answer = str(row.get("answer") or "").strip() or extract_boxed(row.get("solution"))
    if not answer:
        return None
    problem_id = str(row.get("unique_id") or f"{split}/{index}")
    return Problem(id=problem_id, problem=str(row["problem"]).strip(), answer=answer, source=source,
                   level=_level(row.get("level")))


def _level(value) -> int | None:
    """MATH-500 writes its level as an int (the original MATH as "Level 3"); anything else is no level."""
    text = str(value).removeprefix("Level").strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def olympiadbench_problem(row: Row, index: int, split: str, source: str) -> Problem | None:
    answer = olympiadbench_answer(row.get("final_answer"))
    if answer is None:
        return None
    question = str(row["question"]).strip()
    context = row.get("context")
    if isinstance(context, str) and context.strip():
        question = f"{context.strip()}\n\n{question}"
    problem_id = str(row["id"]) if row.get("id") is not None else f"{split}/{index}"
    return Problem(id=problem_id, problem=question, answer=answer, source=source)


def olympiadbench_answer(final_answer: Any) -> str | None:
    """Join OlympiadBench's ``final_answer`` list into one reference string."""
    if final_answer is None:
        return None
    items = [final_answer] if isinstance(final_answer, str) else list(final_answer)
    parts = [_UNESCAPED_DOLLAR.sub("", str(item)).strip() for item in items]
    parts = [p for p in parts if p]
    return ", ".join(parts) or None


MAPPERS: dict[str, Callable[[Row, int, str, str], Problem | None]] = {
    "gsm8k": gsm8k_problem,
    "math500": math500_problem,
    "olympiadbench": olympiadbench_problem,
}
