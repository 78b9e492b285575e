"""Are two final answers the same mathematical object?

Order of checks, cheapest first:

1. clean both sides (``normalize.clean_answer``); an empty side is "no answer",
   which equals nothing;
2. exact fast path: equal canonical spellings are equivalent, two plain integers
   are compared as integers (GSM8K answers never reach sympy);
3. math_verify ``parse`` + ``verify`` (sympy) on both, under ONE wall-clock
   deadline (``deadline.run_with_deadline``) covering parse and verify together.
   math_verify's own whole-second timeouts are switched off because its
   ``signal.alarm`` would cancel that outer deadline. A timeout or any error in
   math_verify counts as "not equivalent": grading never raises.

Answers longer than ``MAX_SLOW_PATH_CHARS`` only get the fast path: a final answer
that long is not a closed form, and sympy on it is where hangs come from.
"""

from __future__ import annotations

import logging

from math_verify import parse, verify

from specscale.grading.deadline import DeadlineExceeded, run_with_deadline
from specscale.grading.normalize import clean_answer, fast_key, integer_value

DEFAULT_TIMEOUT_S = 5.0
MAX_SLOW_PATH_CHARS = 1000

logger = logging.getLogger(__name__)


class _DropDisabledTimeoutNotice(logging.Filter):
    """math_verify warns once that its timeouts are off; ours is on, so the notice misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_NOTICE_FILTER = _DropDisabledTimeoutNotice()
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NOTICE_FILTER)  # idempotent for one filter object


def answers_equivalent(a: str | None, b: str | None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
    """True if ``a`` and ``b`` denote the same answer; symmetric; ``None`` equals nothing.

    math_verify's ``verify(gold, target)`` is not perfectly symmetric, so the two
    cleaned answers are put in a fixed (sorted) order first: swapping the arguments
    never changes the result, which keeps the answer grouping order-independent
    between two answers.
    """
    ca, cb = clean_answer(a), clean_answer(b)
    if ca is None or cb is None:
        return False
    first, second = sorted((ca, cb))
    return cleaned_equivalent(first, second, timeout_s)


def is_correct(predicted: str | None, reference: str | None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
    """True if the predicted final answer matches the reference final answer.

    Both are answers, not whole solutions: extract first (``extract_boxed`` for
    model output; the dataset loaders already store extracted references). The
    reference plays math_verify's "gold" role.
    """
    cp, cr = clean_answer(predicted), clean_answer(reference)
    if cp is None or cr is None:
        return False
    return cleaned_equivalent(cr, cp, timeout_s)


def cleaned_equivalent(gold: str, target: str, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
    """Equivalence of two answers already passed through ``clean_answer``."""
    decided = _fast_decision(gold, target)
    if decided is not None:
        return decided
    if len(gold) > MAX_SLOW_PATH_CHARS or len(target) > MAX_SLOW_PATH_CHARS:
        return False
    try:
        return run_with_deadline(_math_verify_equal, (gold, target), timeout_s)
    except DeadlineExceeded:
        logger.warning("answer comparison ran past %.1fs; counted as not equivalent", timeout_s)
        return False
    except Exception:  # a grader bug must cost one comparison, not the run
        logger.debug("answer comparison failed; counted as not equivalent", exc_info=True)
        return False


def _fast_decision(gold: str, target: str) -> bool | None:
    """True/False when cheap string work settles it, None when sympy must decide."""
    key_gold, key_target = fast_key(gold), fast_key(target)
    if key_gold == key_target:
        return True
    int_gold, int_target = integer_value(key_gold), integer_value(key_target)
    if int_gold is not None and int_target is not None:
        return int_gold == int_target
    return None


def _math_verify_equal(gold: str, target: str) -> bool:
    # Wrapping in \boxed{} makes math_verify take the whole answer as the target of
    # extraction instead of hunting for a number somewhere inside it.
    parsed_gold = parse(_as_boxed_latex(gold), parsing_timeout=None)
    parsed_target = parse(_as_boxed_latex(target), parsing_timeout=None)
    if not parsed_gold or not parsed_target:
        return False
    return bool(verify(parsed_gold, parsed_target, timeout_seconds=None))


def _as_boxed_latex(answer: str) -> str:
    return "$\\boxed{" + answer + "}$"
