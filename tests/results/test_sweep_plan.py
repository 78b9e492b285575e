"""Done cells are skipped before launching; the dry-run listing; counts under every launcher."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cfg_helpers import SMALL, compose_cfg
from specscale.results.plan import plan, report
from specscale.cell_job import run_and_store

ROOT = Path(__file__).resolve().parents[2]


def run_py(*args, check=True):
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_plan_uses_hydra_grammar_and_reads_the_store(tmp_path):
    base = [*SMALL, f"results_dir={tmp_path}", "wandb.mode=disabled"]
    run_and_store(compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled", "beam=4", "policy=full"))
    jobs = plan([*base, "policy=nonspec,full", "beam=range(4,12,4)", "search.max_rounds=8"])
    assert {o for j in jobs for o in j.overrides if o.startswith("beam=")} == {"beam=4", "beam=8"}  # range()
    assert len(jobs) == 4 and sorted(j.status for j in jobs) == ["done", "pending", "pending", "pending"]
    assert report(jobs) == "default: 4 jobs, 4 distinct cells: 1 done, 3 pending"
    # A list value (one job, not split on its comma) and an experiment's own sweep.
    assert len(plan([*base, "metrics.latency_budgets_s=[10,20]"])) == 1
    assert len(plan(["+experiment=fig16_lv_threshold", f"results_dir={tmp_path}"])) == 20


def test_resubmitted_sweep_launches_pending_cells_only(tmp_path):
    base = ["-m", *SMALL, f"results_dir={tmp_path}", "wandb.mode=disabled", "hydra.sweep.dir=" + str(tmp_path / "h")]
    run_py(*base, "policy=nonspec", "beam=4,8")
    out = run_py(*base, "policy=nonspec,full", "beam=4,8")
    assert "4 jobs: 2 to run, 2 done" in out and "4 cells: 2 done, 2 skipped, 0 failed" in out
    assert sorted(p.name for p in (tmp_path / "h").iterdir() if p.is_dir()) == ["0", "1"]  # 2 launched jobs
    listing = subprocess.run([sys.executable, "-m", "specscale.cli", "--dry-run", *base, "policy=nonspec,full,spec",
                              "beam=4,8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "default: 6 jobs, 6 distinct cells: 4 done, 2 pending" in listing.stdout, listing.stderr[-2000:]


def test_two_torch_engines_on_one_gpu_are_refused(tmp_path):
    out = run_py("-m", f"results_dir={tmp_path}", "wandb.mode=disabled", "engine=torch", "model=tiny",
                 "engine.device=cuda", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0,1", check=False)
    assert "hydra.launcher.n_jobs=2 would run several engine=torch cells on one GPU" in out
    assert not list(tmp_path.rglob("attempts.jsonl"))


def test_dry_run_names_an_invalid_cell_instead_of_listing_it(tmp_path, capsys):
    from specscale.results.plan import main

    assert main(["-m", f"results_dir={tmp_path}", "beam=4,6"]) == 2  # beam 6 is not a multiple of expansion 4
    err = capsys.readouterr().err
    assert err.startswith("invalid cell: beam (6) must be a positive multiple of expansion (4)")
