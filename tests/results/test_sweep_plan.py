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


def test_dry_run_list_prints_every_job_with_its_state(tmp_path, capsys):
    from specscale.results.plan import main

    base = ["-m", "+experiment=fig15_breakdown", f"results_dir={tmp_path}"]
    jobs = plan(base[1:])
    policies = ["nonspec", "spec", "ep", "ep_cd", "full"]
    assert [dict(o.split("=", 1) for o in j.overrides)["policy"] for j in jobs] == policies
    jobs[0].cell_dir.mkdir(parents=True)
    (jobs[0].cell_dir / "summary.json").write_text("{}")  # done
    jobs[3].cell_dir.mkdir(parents=True)
    (jobs[3].cell_dir / "error.json").write_text('{"status": "failed"}')
    assert main(["--dry-run", "--list", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fig15_breakdown: 5 jobs, 5 distinct cells: 1 done, 3 pending, 1 failed"
    assert lines[1].split()[:2] == ["every", "job:"] and "+experiment=fig15_breakdown" in lines[1]
    states = ["done", "pending", "pending", "failed", "pending"]
    assert [line.split() for line in lines[2:]] == [[str(i), s, f"policy={p}"]
                                                    for i, (s, p) in enumerate(zip(states, policies), 1)]


def test_dry_run_list_names_jobs_that_share_a_cell(tmp_path):
    jobs = plan(["+experiment=fig16_lv_threshold", f"results_dir={tmp_path}"])
    lines = report(jobs, cells=True).splitlines()
    assert len(lines) == 2 + 20 and lines[0] == "fig16_lv_threshold: 20 jobs, 12 distinct cells: 12 pending"
    shared = [line for line in lines[2:] if "(the cell of job" in line]
    assert len(shared) == 8 and all("policy=ep_cd" in line for line in shared)  # ep_cd ignores B_max


def test_grids_run_the_union_of_their_factorials_and_leave_refused_pairs_out(tmp_path):
    # +experiment=search_family: every budget under nonspec, every policy at N = 16; the
    # searches that select nothing (best_of_n, rebase) run only the non-speculative policies.
    jobs = plan(["+experiment=search_family", "engine=sim", f"results_dir={tmp_path}"])
    by = [dict(o.split("=", 1) for o in j.overrides) for j in jobs]
    assert len(jobs) == len({j.cell_dir for j in jobs}) == 4 * 7 + (7 + 7 + 2 + 2) - 4  # the N = 16 nonspec jobs once
    assert {(b["search"], b["policy"]) for b in by if b["search"] in ("best_of_n", "rebase")} == {
        (s, p) for s in ("best_of_n", "rebase") for p in ("nonspec", "nonspec_cd")}
    assert {b["beam"] for b in by if b["policy"] != "nonspec"} == {"16"}
    assert sorted({int(b["beam"]) for b in by}) == [1, 2, 4, 8, 16, 32, 64]


def test_expansion_follows_the_budget_where_it_must():
    from specscale.compose import compose_config

    for beam, expansion in ((1, 1), (2, 2), (4, 4), (64, 4)):
        cfg = compose_config(["+experiment=search_family", f"beam={beam}"], resolve=True)
        assert (cfg["beam"], cfg["expansion"]) == (beam, expansion)


def test_sweep_leaves_refused_pairs_out_and_stops_when_nothing_is_left(tmp_path):
    base = ["-m", *SMALL, f"results_dir={tmp_path}", "wandb.mode=disabled", "hydra.sweep.dir=" + str(tmp_path / "h")]
    out = run_py(*base, "beam=4", "search=beam,best_of_n", "policy=nonspec,ep")
    assert "1 jobs left out: their search cannot run their policy" in out
    assert "3 cells: 3 done, 0 skipped, 0 failed, 1 search x policy jobs left out (refused pairs)" in out
    out = run_py(*base, "beam=4", "search=best_of_n", "policy=ep,full", check=False)
    assert "error: search.kind=best_of_n cannot run policy.speculation=naive" in out and "(in the sweep's job" in out
