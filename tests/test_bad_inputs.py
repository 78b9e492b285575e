"""Every bad input fails early with an error that names the setting."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.settings.search_policy import ConfigError
from specscale.data.loader import load_problems
from specscale.data.source import PACKAGE_DIR
from specscale.engine.generation import KVCapacityError
from specscale.settings import CellSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("setting, message", [
    ("search.temperature=-1", "search.temperature must be a number in [0.0, inf), got -1"),
    ("search.top_p=0", "search.top_p must be a number in (0.0, 1.0]"),
    ("search.top_p=1.5", "search.top_p"),
    ("search.max_rounds=0", "search.max_rounds must be an integer >= 1"),
    ("beam=abc", "beam must be an integer"),
    ("concurrency=1.5", "concurrency must be an integer"),
    ("seed=-1", "seed must be an integer >= 0"),
    ("n_problems=0", "n_problems must be an integer >= 1"),
    ("n_problems=all", "n_problems=all needs a dataset"),  # engine=sim synthesizes its problems
    ("n_problems=600", "n_problems=600 is more than dataset math500 holds (500 problems)"),  # the sim too
    ("dataset=olympiadbench n_problems=676", "dataset olympiadbench holds (675 problems)"),
    ("engine.max_num_seqs=0", "engine.max_num_seqs"),
    ("engine.block_size=0", "engine.block_size"),
    ("engine.kv_blocks=0", "engine.kv_blocks must be an integer >= 1 or null"),
    ("engine.max_num_batched_tokens=8", "engine.max_num_batched_tokens"),
    ("workload=poisson workload.rate=-2", "workload.rate"),
    ("wandb.mode=sometimes", "wandb.mode must be one of"),  # before the cell runs, not after
])
def test_bad_setting_names_its_key(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        CellSpec.from_config(compose_cfg(*setting.split()))


@pytest.mark.parametrize("setting, message", [
    ("engine.attention=fast", "engine.attention"),
    ("engine.device=tpu", "engine.device"),
    ("engine.cpu_kv_blocks=0", "engine.cpu_kv_blocks"),
    ("engine.fused_ops=yes", "engine.fused_ops must be true or false"),
])
def test_bad_torch_engine_setting_names_its_key(setting, message):
    with pytest.raises(ConfigError, match=message):
        CellSpec.from_config(compose_cfg("engine=torch", "model=tiny", setting))


def test_unknown_top_level_key_is_rejected():
    with pytest.raises(ConfigError, match=r"unknown top-level setting\(s\) \['beem'\]"):
        CellSpec.from_config(compose_cfg("+beem=4"))
    CellSpec.from_config(compose_cfg("+experiment=fig13_ablation"))  # experiments set known keys only


@pytest.mark.parametrize("args, names", [
    (["+beem=4"], "unknown top-level setting(s) ['beem']"),
    (["beam=0"], "beam must be an integer >= 1, got 0"),
    (["-m", "beam=0,4"], "beam must be an integer >= 1, got 0 (in the sweep's job beam=0"),
])
def test_a_bad_setting_is_one_line_and_exit_status_2(tmp_path, args, names):
    proc = subprocess.run([sys.executable, "run.py", *args, f"results_dir={tmp_path}", "wandb.mode=disabled"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_without_full_errors())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[len('error: '):]}"]
    assert names in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("summary.json"))


def test_debug_shows_the_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "run.py", "beam=0", "--debug", f"results_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_without_full_errors())
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "beam must be" in proc.stderr


def _without_full_errors() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}


def _data(tmp_path, text: str) -> dict:
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    return {**compose_cfg("dataset=fixture_gsm8k")["dataset"], "data_files": str(path)}


GOOD = json.dumps({"question": "1+1?", "answer": "2 #### 2"})


def test_truncated_json_line_names_file_and_line(tmp_path):
    ds = _data(tmp_path, GOOD + "\n" + GOOD[:-5] + "\n")
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: not valid JSON"):
        load_problems(ds)


def test_missing_field_names_file_line_and_field(tmp_path):
    ds = _data(tmp_path, GOOD + "\n" + json.dumps({"question": "2+2?"}) + "\n")
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: missing field 'answer'"):
        load_problems(ds)


def test_empty_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"rows\.jsonl: no rows"):
        load_problems(_data(tmp_path, ""))


def test_missing_parquet_column_names_the_field(tmp_path):
    import pandas as pd

    path = tmp_path / "rows.parquet"
    pd.DataFrame({"question": ["1+1?"]}).to_parquet(path)
    ds = {**compose_cfg("dataset=fixture_gsm8k")["dataset"], "data_files": str(path)}
    with pytest.raises(ConfigError, match="missing column 'answer'"):
        load_problems(ds)


def test_n_problems_beyond_the_dataset_is_an_error_or_all():
    ds = compose_cfg("dataset=fixture_gsm8k")["dataset"]
    rows = sum(1 for line in (PACKAGE_DIR / "fixtures" / "gsm8k.jsonl").read_text().splitlines() if line.strip())
    with pytest.raises(ConfigError, match=rf"n_problems=50 but dataset 'fixture_gsm8k' has {rows} usable.*n_problems=all"):
        load_problems(ds, n_problems=50)
    assert len(load_problems(ds)) == rows  # n_problems=all reaches the loader as None


def test_kv_capacity_error_names_the_setting_to_raise():
    with pytest.raises(KVCapacityError, match="raise engine.kv_blocks"):
        build_server(compose_cfg("engine.kv_blocks=1", "policy=nonspec")).run()
