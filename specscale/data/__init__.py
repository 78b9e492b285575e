"""Datasets, records and generator prompts.

Public API:
    load_problems(cfg) -> list[Problem]          (loader; cfg = the dataset config group)
    Problem(id, problem, answer, source)         (problem)
    DatasetUnavailableError                      (source)
    SYSTEM_PROMPT, STEP_DELIMITER,
    build_generator_prompt(tokenizer, problem_text, assistant_prefix="")   (prompts)

Heavy libraries (datasets, transformers) are imported only when used.
"""

from specscale.data.loader import load_problems
from specscale.data.problem import Problem
from specscale.data.prompts import (
    QWEN_STYLE_CHAT_TEMPLATE,
    STEP_DELIMITER,
    SYSTEM_PROMPT,
    build_generator_prompt,
    build_messages,
)
from specscale.data.source import DatasetUnavailableError

__all__ = [
    "DatasetUnavailableError",
    "Problem",
    "QWEN_STYLE_CHAT_TEMPLATE",
    "STEP_DELIMITER",
    "SYSTEM_PROMPT",
    "build_generator_prompt",
    "build_messages",
    "load_problems",
]
