"""dataset=arith: the generator's knobs, the shipped test split, and grading through the common path."""

import json
import random

import pytest

from specscale.data.arith import (TEST_FILE, TEST_SIZE, ArithProblem, ArithSpec, parse_question, problems,
                                  sample_problem, held_out_problems, write_test_split)  # fmt: skip
from specscale.data.loader import load_problems
from specscale.data.prompts import STEP_DELIMITER
from specscale.grading import extract_boxed, is_correct


def test_shipped_split_is_what_the_generator_writes(tmp_path):
    write_test_split(tmp_path / "arith.jsonl")
    assert (tmp_path / "arith.jsonl").read_text() == TEST_FILE.read_text()
    assert sum(1 for _ in TEST_FILE.open()) == TEST_SIZE


def test_loader_reads_the_split_and_references_grade_correct(dataset_cfg):
    loaded = load_problems(dataset_cfg("arith"), n_problems=40)
    rows = [json.loads(line) for line in TEST_FILE.read_text().splitlines()[:40]]
    assert [p.problem for p in loaded] == [r["problem"] for r in rows]
    assert {p.source for p in loaded} == {"arith"}
    for p, r in zip(loaded, rows):
        assert is_correct(extract_boxed(r["solution"]), p.answer)
        assert not is_correct(str(int(p.answer) + 1), p.answer)


def test_questions_are_distinct_and_parse_back():
    ps = held_out_problems()
    assert len({p.question for p in ps}) == len(ps)
    for p in ps[:100]:
        assert parse_question(p.question) == p


def test_solution_has_one_step_per_operation_and_bounded_values():
    spec = ArithSpec(min_ops=2, max_ops=4, max_value=49)
    rng = random.Random(3)
    for _ in range(300):
        p = sample_problem(rng, spec)
        assert 2 <= len(p.ops) <= 4
        assert all(0 <= v <= 49 for v in [p.first, *p.values()])
        steps = p.solution.split(STEP_DELIMITER)
        assert len(steps) == len(p.ops) + 1
        assert extract_boxed(steps[-1]) == str(p.answer)


def test_knobs_change_the_problems():
    rng = random.Random(0)
    big = [sample_problem(rng, ArithSpec(min_ops=5, max_ops=6, max_value=999, operators="+-*", bounded=False))
           for _ in range(200)]  # fmt: skip
    assert all(5 <= len(p.ops) <= 6 for p in big)
    assert {op for p in big for op, _ in p.ops} == {"+", "-", "*"}
    assert max(abs(v) for p in big for v in p.values()) > 999  # unbounded: results leave the range


def test_streams_are_deterministic_and_skip_excluded_questions():
    a = [next(s) for s in [problems(5)] for _ in range(50)]
    s = problems(5)
    assert [next(s) for _ in range(50)] == a
    excluded = {p.question for p in a[:10]}
    s = problems(5, exclude=excluded)
    assert not excluded & {next(s).question for _ in range(50)}


@pytest.mark.parametrize("bad", [dict(min_ops=0), dict(min_ops=3, max_ops=2), dict(max_value=0),
                                 dict(operators="/"), dict(operators="")])  # fmt: skip
def test_bad_knobs_fail(bad):
    with pytest.raises(ValueError):
        ArithSpec(**bad)


@pytest.mark.parametrize("text", ["Compute 3.", "3+4.", "Compute 3+.", "Compute 3/4."])
def test_parse_rejects_other_text(text):
    with pytest.raises(ValueError):
        parse_question(text)


def test_problem_value_chain():
    p = ArithProblem(10, (("+", 5), ("-", 12), ("*", 3)))
    assert p.values() == [15, 3, 9] and p.answer == 9
    assert p.question == "Compute 10+5-12*3."
