"""The bundled fixtures: regenerated files match, answers are self-consistent, configs are complete."""

from pathlib import Path

import pytest
import yaml

from specscale.data.make_fixtures import (
    FIXTURE_DIR,
    FIXTURES,
    GSM8K_ROWS,
    MATH500_ROWS,
    render_jsonl,
    write_fixtures,
)
from specscale.grading import extract_boxed, extract_gsm8k_reference, is_correct

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "dataset"

SIM = {
    "gsm8k": {"difficulty_mean": 0.25, "prompt_tokens_mean": 110},
    "math500": {"difficulty_mean": 0.55, "prompt_tokens_mean": 120},
    "olympiadbench": {"difficulty_mean": 0.8, "prompt_tokens_mean": 200},
}
KEYS = {"name", "hub_name", "config_name", "revision", "split", "schema", "sample", "sample_seed", "data_dir", "data_files",
        "problems", "sim"}


def test_checked_in_fixtures_match_the_writer(tmp_path):
    write_fixtures(tmp_path)
    for filename, rows in FIXTURES.items():
        assert (FIXTURE_DIR / filename).read_text(encoding="utf-8") == render_jsonl(rows)
        assert (tmp_path / filename).read_text(encoding="utf-8") == render_jsonl(rows)
        assert 8 <= len(rows) <= 20


def test_gsm8k_fixture_answers_match_the_last_calculation():
    for row in GSM8K_ROWS:
        calculations = row["answer"].split("<<")
        last_result = calculations[-1].split(">>")[0].split("=")[-1]
        assert float(extract_gsm8k_reference(row["answer"])) == float(last_result)


def test_math500_fixture_solutions_box_the_answer():
    for row in MATH500_ROWS:
        assert is_correct(extract_boxed(row["solution"]), row["answer"])


@pytest.mark.parametrize("schema", sorted(SIM))
def test_dataset_configs(schema):
    real = yaml.safe_load((CONF_DIR / f"{schema}.yaml").read_text())
    fixture = yaml.safe_load((CONF_DIR / f"fixture_{schema}.yaml").read_text())
    for cfg in (real, fixture):
        assert set(cfg) == KEYS
        assert cfg["schema"] == schema
        assert cfg["sim"] == SIM[schema]
    assert real["name"] == schema and real["hub_name"]
    assert fixture["name"] == f"fixture_{schema}" and fixture["data_files"]
    assert fixture["split"] == real["split"]
    assert real["sample"] == (1000 if schema == "gsm8k" else None)
