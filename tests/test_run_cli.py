"""run.py end to end through Hydra: a single run and a multirun write their result files."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from cfg_helpers import SMALL

ROOT = Path(__file__).resolve().parents[1]


def _run(args, tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", *[a for a in args if a == "-m"], *SMALL, *[a for a in args if a != "-m"]], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_single_run_writes_results(tmp_path):
    proc = _run(["engine=sim", "policy=full", f"results_dir={tmp_path}", "wandb.mode=disabled"], tmp_path)
    assert "output_tok_s" in proc.stdout
    (out,) = [p.parent for p in tmp_path.rglob("summary.json")]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("output_tok_s", "logical_tok_s", "throughput_tok_s", "norm_latency_ms_per_output_tok",
                "norm_latency_ms_per_tok", "time_other_s", "prm_tokens_per_logical_token", "prm_kv_blocks_total", "accuracy", "prm_invocations",
                "physical_logical_ratio", "kv_peak_blocks", "shortcut_round_fraction", "time_generation_s"):
        assert key in summary
    rounds = pd.read_parquet(out / "rounds.parquet")
    for col in ("request_id", "round", "member_keys", "member_texts", "member_scores", "selected_keys", "closed_by"):
        assert col in rounds.columns
    for name in ("requests", "verify_batches", "iterations"):
        assert len(pd.read_parquet(out / f"{name}.parquet")) > 0
    assert json.loads((out / "config.json").read_text())["policy"]["name"] == "full"


def test_a_profiled_sim_cell_runs_under_run_py(tmp_path):
    # The sim checks a profile's speed probe by building the torch engine it probes, which
    # composes a config inside run.py's running Hydra app.
    _run(["engine=sim", "model=tiny", "dataset=fixture_math500", "hardware=profiled/cpu-tiny", "n_problems=2",
          f"results_dir={tmp_path}", "wandb.mode=disabled"], tmp_path)
    (summary,) = tmp_path.rglob("summary.json")
    assert json.loads(summary.read_text())["engine"] == "sim"
    assert not list(tmp_path.rglob("error.json"))


def test_multirun_one_directory_per_cell(tmp_path):
    _run(["-m", "policy=nonspec,spec", "beam=4,8", f"results_dir={tmp_path}", "wandb.mode=disabled"], tmp_path)
    cells = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("summary.json"))
    assert len(cells) == 4
    assert any("/nonspec/b4-" in c for c in cells)


def test_a_failing_single_run_exits_non_zero(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", *SMALL, "engine.kv_blocks=1", f"results_dir={tmp_path}", "wandb.mode=disabled"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "error.json" in proc.stderr + proc.stdout
    assert len(list(tmp_path.rglob("error.json"))) == 1
