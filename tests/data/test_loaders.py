"""Each loader through the real datasets.load_dataset path, on the bundled fixtures."""

import json

import pytest

from specscale.data import Problem, load_problems
from specscale.data.make_fixtures import GSM8K_ROWS, MATH500_ROWS, OLYMPIADBENCH_ROWS
from specscale.data.source import load_arguments
from specscale.settings.dataset import spec_from_config


def test_gsm8k_fixture(dataset_cfg):
    problems = load_problems(dataset_cfg("fixture_gsm8k"))
    assert len(problems) == len(GSM8K_ROWS)
    assert all(isinstance(p, Problem) for p in problems)
    first = problems[0]
    assert first == Problem(id="test/0", problem=GSM8K_ROWS[0]["question"], answer="12", source="fixture_gsm8k")
    by_id = {p.id: p for p in problems}
    assert by_id["test/8"].answer == "2030"  # "#### 2,030": commas stripped


def test_math500_fixture(dataset_cfg):
    problems = load_problems(dataset_cfg("fixture_math500"))
    assert [p.id for p in problems] == [row["unique_id"] for row in MATH500_ROWS]
    assert problems[1].answer == "\\frac{5}{6}"
    assert problems[1].problem == MATH500_ROWS[1]["problem"]
    assert {p.source for p in problems} == {"fixture_math500"}
    assert [p.level for p in problems] == [row["level"] for row in MATH500_ROWS]  # results read accuracy per level


@pytest.mark.parametrize("value, level", [(3, 3), ("3", 3), ("Level 4", 4), (None, None), ("?", None)])
def test_math500_level_field(value, level):
    from specscale.data.schemas import math500_problem

    row = {"problem": "What is 1+1?", "answer": "2", "level": value}
    assert math500_problem(row, 0, "test", "x").level == level


def test_olympiadbench_fixture(dataset_cfg):
    problems = load_problems(dataset_cfg("fixture_olympiadbench"))
    assert len(problems) == len(OLYMPIADBENCH_ROWS)
    by_id = {p.id: p for p in problems}
    assert by_id["9001"].answer == "15"  # "$15$": delimiters removed
    assert by_id["9003"].answer == "1, 2"  # a list of answers is joined
    assert by_id["9008"].answer == "[-2, 4]"
    assert by_id["9012"].problem == "Let $k = 4$.\n\nCompute $k^3 - k$."  # context prepended


def test_loads_through_load_dataset_json_builder(dataset_cfg):
    path, kwargs = load_arguments(spec_from_config(dataset_cfg("fixture_gsm8k")))
    assert path == "json"
    assert list(kwargs["data_files"]) == ["test"]
    assert kwargs["data_files"]["test"][0].endswith("specscale/data/fixtures/gsm8k.jsonl")


def test_gsm8k_sample_depends_only_on_seed(dataset_cfg):
    a = load_problems(dataset_cfg("fixture_gsm8k", sample=5, sample_seed=0))
    b = load_problems(dataset_cfg("fixture_gsm8k", sample=5, sample_seed=0))
    c = load_problems(dataset_cfg("fixture_gsm8k", sample=5, sample_seed=1))
    assert len(a) == 5 and len({p.id for p in a}) == 5
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.id for p in a] != [p.id for p in c]


def test_n_problems_takes_a_prefix_of_the_sample(dataset_cfg):
    sampled = load_problems(dataset_cfg("fixture_gsm8k", sample=8, sample_seed=3))
    first_three = load_problems(dataset_cfg("fixture_gsm8k", sample=8, sample_seed=3, n_problems=3))
    assert first_three == sampled[:3]
    assert len(load_problems(dataset_cfg("fixture_math500", n_problems=4))) == 4
    assert len(load_problems(dataset_cfg("fixture_math500", n_problems=4), n_problems=2)) == 2


def test_plain_dict_config_and_any_cwd(dataset_cfg, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)  # the fixture path is relative to the package, not the cwd
    cfg = OmegaConf.to_container(dataset_cfg("fixture_math500"))
    assert isinstance(cfg, dict)
    assert len(load_problems(cfg)) == len(MATH500_ROWS)


def test_data_dir_override_goes_through_load_dataset(dataset_cfg, tmp_path):
    local = tmp_path / "gsm8k_snapshot"
    local.mkdir()
    rows = GSM8K_ROWS[:4]
    (local / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = dataset_cfg("gsm8k", data_dir=str(local), config_name=None, sample=None)
    problems = load_problems(cfg)
    assert [p.problem for p in problems] == [r["question"] for r in rows]
    assert problems[0].source == "gsm8k"


def test_data_files_override_on_real_config(dataset_cfg, tmp_path):
    path = tmp_path / "olympiad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in OLYMPIADBENCH_ROWS[:3]))
    problems = load_problems(dataset_cfg("olympiadbench", data_files=str(path)))
    assert [p.answer for p in problems] == ["15", "91", "1, 2"]


def test_offline_mode_still_loads_local_files(dataset_cfg, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert len(load_problems(dataset_cfg("fixture_olympiadbench"))) == len(OLYMPIADBENCH_ROWS)


def test_unknown_schema_is_rejected(dataset_cfg):
    with pytest.raises(ValueError, match="schema"):
        load_problems(dataset_cfg("fixture_gsm8k", schema="aime"))
