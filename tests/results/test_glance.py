"""Results at a glance: the table that ends every run and sweep, and ``specscale show``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from cfg_helpers import SMALL
from specscale.results import glance

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_sweep_ends_with_its_cells_done_skipped_and_failed(tmp_path):
    first = _run("-m", *SMALL, "policy=nonspec", f"results_dir={tmp_path}", "wandb.mode=disabled")
    assert first.returncode == 0, first.stderr[-2000:]
    # nonspec again (skipped: done before), full (done now), and a cell whose KV pool is too small
    proc = _run("-m", *SMALL, "policy=nonspec,full", f"results_dir={tmp_path}", "wandb.mode=disabled")
    assert proc.returncode == 0, proc.stderr[-2000:]
    failing = _run("-m", *SMALL, "policy=ep", "engine.kv_blocks=2", f"results_dir={tmp_path}", "wandb.mode=disabled")
    out = proc.stdout
    assert "the sweep's cells at a glance" in out and "[sweep] finished: 2 cells: 1 done, 1 skipped" in out
    table = out[out.index("the sweep's cells at a glance"):]
    rows = [line for line in table.splitlines() if line.startswith("│") and "simulated (roofline" in line]
    assert len(rows) == 2, out  # the skipped nonspec cell (done before) is in the table too
    nonspec = next(r for r in rows if " nonspec " in r)
    assert "1.00x" in nonspec  # its own reference
    assert any(" full " in r for r in rows)
    table = failing.stdout[failing.stdout.index("the sweep's cells at a glance"):]
    assert "failed" in table and "KVCapacityError" in table


def test_show_reads_any_store_with_filters_and_writes_csv(tmp_path):
    proc = _run("-m", *SMALL, "policy=nonspec,full", f"results_dir={tmp_path}", "wandb.mode=disabled")
    assert proc.returncode == 0, proc.stderr[-2000:]
    csv = tmp_path / "glance.csv"
    assert glance.main([str(tmp_path), "policy=full", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    assert list(df["policy"]) == ["full"]
    # the ratios come from the nonspec cell of the same condition and seed, filtered out of the view
    assert df["vs_nonspec"].notna().all() and df["speedup"].notna().all()
    assert glance.main([str(tmp_path / "missing")]) == 2


def test_every_engine_kind_is_named():
    sim = {"engine": "sim", "hardware": "A100-SXM4-80GB"}
    prof = {"engine": "sim", "hardware": "profiled:cpu-tiny"}
    torch_cell = {"engine": "torch", "hardware": "AMD EPYC", "provenance": {"device": {"name": "AMD EPYC"}}}
    vllm = {"engine": "vllm", "hardware": "x", "provenance": {"device": {"name": "NVIDIA H200"},
                                                             "versions": {"vllm": "0.32.0"}}}
    assert glance.engine_kind(sim) == "simulated (roofline A100-SXM4-80GB, calibrated)"
    assert glance.engine_kind(prof) == "simulated (profile cpu-tiny)"
    assert glance.engine_kind(torch_cell) == "measured: torch on AMD EPYC"
    assert glance.engine_kind(vllm) == "measured: vLLM 0.32.0 on NVIDIA H200"


def test_a_store_with_sim_and_torch_cells_labels_each(tmp_path):
    for engine in (["engine=sim"], ["engine=torch", "model=tiny", "dataset=fixture_math500"]):
        proc = _run(*SMALL, *engine, "policy=nonspec", f"results_dir={tmp_path}", "wandb.mode=disabled")
        assert proc.returncode == 0, proc.stderr[-2000:]
    df = glance.table(glance.store_cells(tmp_path))
    kinds = sorted(df["measured"])
    assert kinds[0].startswith("measured: torch on ") and kinds[1].startswith("simulated (roofline ")


def test_the_summary_and_its_header_say_how_the_numbers_were_obtained(tmp_path):
    from specscale.cell import format_summary, run_cell
    from cfg_helpers import compose_cfg

    summary = run_cell(compose_cfg(*SMALL, "policy=nonspec"), out_dir=tmp_path)
    assert summary["measured"] == "simulated (roofline A100-SXM4-80GB, calibrated)"
    assert format_summary(summary).lstrip().startswith("simulated (roofline A100-SXM4-80GB, calibrated)")


def test_rows_that_differ_only_in_a_swept_setting_say_which():
    def cell(seed, ablation, policy="nonspec"):
        return {"status": "ok", "policy": policy, "beam": 8, "concurrency": 32, "seed": seed, "ablation": ablation,
                "engine": "sim", "hardware": "A100", "context_hash": ablation, "output_tok_s": 100.0 + seed,
                "makespan_s": 10.0, "cell_dir": f"/r/{ablation}/{policy}/{seed}"}

    df = glance.table([cell(0, "none"), cell(1, "none"), cell(0, "short_prompts"), cell(1, "short_prompts")])
    assert list(df["setting"]) == ["ablation=none seed=0", "ablation=none seed=1", "ablation=short_prompts seed=0",
                                   "ablation=short_prompts seed=1"]
    assert glance.table([cell(0, "none"), cell(0, "none", "full")])["setting"].tolist() == ["", ""]  # nothing varies
