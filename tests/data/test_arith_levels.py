"""dataset=arith difficulty levels: the level specs, the level-mixture streams, the levels
test split and the held-out hard split (disjoint from training streams and each other)."""

import json
import random
from itertools import islice

import pytest

from specscale.data.arith import (HARD_FILE, HARD_LEVEL, HARD_SIZE, HARD_SPEC, LEVELS, LEVELS_TEST_FILE,
                                  LEVELS_TEST_PER_LEVEL, TEST_FILE, ArithSpec, LevelMix, carries, hard_problems,
                                  held_out_problems, level_problems, level_spec, levels_held_out_questions,
                                  levels_test_problems, problems, read_split, sample_problem, write_hard_split,
                                  write_levels_test_split, write_test_split)  # fmt: skip
from specscale.data.loader import load_problems
from specscale.grading import extract_boxed, is_correct


def _obeys(p, spec: ArithSpec) -> bool:
    if not spec.min_ops <= len(p.ops) <= spec.max_ops:
        return False
    acc = p.first
    if not 0 <= acc <= spec.max_value:
        return False
    for (op, n), value in zip(p.ops, p.values()):
        if op not in spec.operators or not 0 <= value <= spec.max_value:
            return False
        if spec.carry == "none" and carries(acc, op, n):
            return False
        acc = value
    return True


def _all_carry(p, spec: ArithSpec) -> bool:
    """Every operation carries or borrows where some operand in range could (the 'all' rule)."""
    acc = p.first
    for (op, n), value in zip(p.ops, p.values()):
        possible = any(carries(acc, o, b) for o in spec.operators
                       for b in range((spec.max_value - acc if o == "+" else acc) + 1))  # fmt: skip
        if possible and not carries(acc, op, n):
            return False
        acc = value
    return True


def test_default_spec_and_shipped_split_unchanged(tmp_path):
    assert ArithSpec() == ArithSpec(min_ops=2, max_ops=4, max_value=49, operators="+-", bounded=True, carry="any")
    write_test_split(tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").read_text() == TEST_FILE.read_text()
    assert json.loads(TEST_FILE.read_text().splitlines()[0])["level"] == len(held_out_problems(1)[0].ops)


@pytest.mark.parametrize("level", [*LEVELS, HARD_LEVEL])
def test_every_level_obeys_its_spec(level):
    spec = level_spec(level)
    rng = random.Random(level)
    ps = [sample_problem(rng, spec) for _ in range(300)]
    assert all(_obeys(p, spec) for p in ps)
    if spec.carry == "all":
        assert all(_all_carry(p, spec) for p in ps)
        assert sum(carries(a, op, n) for p in ps for a, (op, n) in zip([p.first, *p.values()], p.ops)) > 0.95 * sum(
            len(p.ops) for p in ps)  # fmt: skip
    if spec.carry == "none":
        assert not any(carries(a, op, n) for p in ps for a, (op, n) in zip([p.first, *p.values()], p.ops))


def test_levels_get_harder_and_hard_is_beyond_training():
    assert [LEVELS[k].max_ops for k in sorted(LEVELS)] == sorted(LEVELS[k].max_ops for k in LEVELS)
    assert HARD_SPEC.min_ops > max(s.max_ops for s in LEVELS.values())
    with pytest.raises(ValueError):
        level_spec(99)
    with pytest.raises(ValueError):
        ArithSpec(carry="some")
    with pytest.raises(ValueError):
        ArithSpec(operators="+-*", carry="all")


def test_level_streams_are_deterministic_and_mix_levels():
    a = list(islice(level_problems(7), 300))
    assert a == list(islice(level_problems(7), 300))
    assert a != list(islice(level_problems(8), 300))
    assert {lv for lv, _ in a} == set(LEVELS)
    assert all(_obeys(p, LEVELS[lv]) for lv, p in a)
    assert len({p.question for _, p in a}) == len(a)
    # problems() takes a LevelMix and yields the same problems
    assert list(islice(problems(7, LevelMix()), 300)) == [p for _, p in a]
    only = list(islice(level_problems(3, LevelMix((2, 5), (1.0, 3.0))), 400))
    counts = {lv: sum(1 for x, _ in only if x == lv) for lv in (2, 5)}
    assert set(counts) == {2, 5} and counts[5] > 2 * counts[2]
    with pytest.raises(ValueError):
        LevelMix((1, 2), (1.0,))


def test_splits_are_what_the_generator_writes(tmp_path):
    write_levels_test_split(tmp_path / "levels.jsonl")
    write_hard_split(tmp_path / "hard.jsonl")
    assert (tmp_path / "levels.jsonl").read_text() == LEVELS_TEST_FILE.read_text()
    assert (tmp_path / "hard.jsonl").read_text() == HARD_FILE.read_text()
    levels = read_split(LEVELS_TEST_FILE)
    assert levels == levels_test_problems()
    assert [lv for lv, _ in levels] == [lv for lv in LEVELS for _ in range(LEVELS_TEST_PER_LEVEL)]
    assert all(_obeys(p, LEVELS[lv]) for lv, p in levels)
    hard = read_split(HARD_FILE)
    assert [p for _, p in hard] == hard_problems() and len(hard) == HARD_SIZE
    assert {lv for lv, _ in hard} == {HARD_LEVEL} and all(_obeys(p, HARD_SPEC) for _, p in hard)


def test_splits_are_disjoint_from_each_other_and_from_training_streams():
    levels = {p.question for _, p in read_split(LEVELS_TEST_FILE)}
    hard = {p.question for _, p in read_split(HARD_FILE)}
    shipped = {json.loads(line)["problem"] for line in TEST_FILE.read_text().splitlines()}
    assert len(levels) == len(LEVELS) * LEVELS_TEST_PER_LEVEL and len(hard) == HARD_SIZE
    assert not levels & hard
    excluded = levels_held_out_questions()
    assert levels | hard | shipped <= excluded
    # Training streams (the seeds runners.train_testbed draws from) never yield a split's question,
    # although without the exclusion they would (the level-1 space is small).
    for seed in (1, 3, 4, 5):
        drawn = {p.question for p in islice(problems(seed, LevelMix(), excluded), 3000)}
        assert not drawn & (levels | hard | shipped)
    unexcluded = {p.question for p in islice(problems(1, LevelMix()), 3000)}
    assert unexcluded & levels


def test_level_rows_load_and_grade(dataset_cfg):
    cfg = dataset_cfg("arith_levels")
    assert cfg.name == "arith_levels"  # the testbed's task in other splits: model=testbed pairs with it
    loaded = load_problems(cfg, n_problems=500)
    assert [p.level for p in loaded] == [r["level"] for r in (json.loads(x) for x in LEVELS_TEST_FILE.read_text().splitlines())]
    rows = [json.loads(line) for line in LEVELS_TEST_FILE.read_text().splitlines()]
    assert [p.problem for p in loaded] == [r["problem"] for r in rows]
    for p, r in zip(loaded, rows):
        assert is_correct(extract_boxed(r["solution"]), p.answer)
