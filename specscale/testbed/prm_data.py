"""PRM training data: reference solutions with planted errors, labelled per step.

A step's label is 1 when it and every step before it are right (the Qwen2.5-Math-PRM
convention: a path that went wrong never recovers), so with ``score_agg=last`` the last
step's reward speaks for the whole path. Errors are planted at a uniformly drawn step
(the answer step included) and the solution then continues from the wrong value with
correct arithmetic, as a generator that slipped once would; the kinds of error are the
ones a small generator makes: a wrong result (a digit, a carry, a sign), a wrong
carried value, a wrong operand or operator, an answer boxed early or mis-copied.
Because every position is as likely to hold the first error, the step's position alone
cannot predict its label: the PRM has to check the arithmetic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specscale.data.arith import ArithProblem, answer_step, apply, op_step

ERROR_KINDS = ("result", "result", "result", "carry", "operand", "operator")


@dataclass(frozen=True)
class LabelledPath:
    question: str
    steps: tuple[str, ...]
    labels: tuple[int, ...]  # 1 = this step and all before it are right

    @property
    def first_error(self) -> int | None:
        return next((i for i, y in enumerate(self.labels) if y == 0), None)


def near_miss(rng: random.Random, value: int) -> int:
    """A plausible wrong result: off by a carry, a digit or a small amount."""
    while True:
        kind = rng.randrange(5)
        if kind == 0:
            wrong = value + rng.choice([-1, 1, -2, 2])
        elif kind == 1:
            wrong = value + rng.choice([-10, 10, -9, 9, -11, 11])
        elif kind == 2:  # one digit replaced
            digits = list(str(abs(value)))
            i = rng.randrange(len(digits))
            digits[i] = str(rng.randrange(10))
            wrong = int("".join(digits)) * (1 if value >= 0 else -1)
        elif kind == 3:  # digits swapped / a digit dropped or repeated
            s = str(abs(value))
            wrong = int(s[::-1]) if len(s) > 1 else int(s + s)
        else:
            wrong = rng.randint(0, max(99, value + 10))
        if wrong != value:
            return wrong


def plant(p: ArithProblem, rng: random.Random, error_at: int | None) -> LabelledPath:
    """The reference solution of ``p`` with its first error at step ``error_at`` (None: no error).

    Steps 0..k-1 are the operations, step k the answer sentence."""
    k = len(p.ops)
    if error_at is not None and not 0 <= error_at <= k:
        raise ValueError(f"error_at must be in [0, {k}], got {error_at}")
    early = rng.randint(1, k - 1) if error_at == k and k >= 2 and rng.random() < 0.3 else None
    acc, steps = p.first, []
    for i, (op, n) in enumerate(p.ops):
        a = acc
        if i == error_at:
            kind = rng.choice(ERROR_KINDS)
            if kind == "carry":  # the previous result carried over wrongly
                a = near_miss(rng, acc)
                steps.append(op_step(a, op, n, apply(a, op, n)))
            elif kind == "operand":
                m = near_miss(rng, n) if rng.random() < 0.5 else rng.choice([p.first] + [x for _, x in p.ops])
                m = m if m != n else n + 1
                steps.append(op_step(a, op, m, apply(a, op, m)))
            elif kind == "operator":
                other = rng.choice([o for o in "+-" if o != op])
                steps.append(op_step(a, other, n, apply(a, other, n)))
            else:
                steps.append(op_step(a, op, n, near_miss(rng, apply(a, op, n))))
            acc = int(steps[-1].rsplit("=", 1)[1])
            continue
        if error_at is not None and i > error_at and error_at < k and rng.random() < 0.15:
            # After the first error a weak solver slips again now and then.
            steps.append(op_step(a, op, n, near_miss(rng, apply(a, op, n))))
            acc = int(steps[-1].rsplit("=", 1)[1])
            continue
        acc = apply(a, op, n)
        steps.append(op_step(a, op, n, acc))
        if i + 1 == early:
            # The answer boxed before the last operation (the "first error" is that answer step).
            steps.append(answer_step(acc))
            return _labelled(p, steps, len(steps) - 1)
    boxed = near_miss(rng, acc) if error_at == k else acc
    steps.append(answer_step(boxed))
    return _labelled(p, steps, error_at)


def _labelled(p: ArithProblem, steps: list[str], error_at: int | None) -> LabelledPath:
    labels = [1 if error_at is None or i < error_at else 0 for i in range(len(steps))]
    return LabelledPath(p.question, tuple(steps), tuple(labels))


def sample_path(p: ArithProblem, rng: random.Random, clean_share: float = 0.4) -> LabelledPath:
    """A correct path with probability ``clean_share``, else one error at a uniform position."""
    if rng.random() < clean_share:
        return plant(p, rng, None)
    return plant(p, rng, rng.randint(0, len(p.ops)))
