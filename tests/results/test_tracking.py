"""W&B (offline mode): one run per cell that a rerun resumes, a clean summary."""
from __future__ import annotations

import json
from pathlib import Path

from cfg_helpers import compose_cfg
from specscale.cell_job import run_and_store
from specscale.results.tracking import flatten
from wandb_reader import history_keys, run_id, summary


def test_rerun_resumes_the_same_run_and_summary_is_flat(tmp_path):
    cfg = compose_cfg(f"results_dir={tmp_path}", "wandb.mode=offline", "experiment_name=wb", "policy=full")
    first = run_and_store(cfg)
    cell = Path(first["cell_dir"])
    (cell / "summary.json").unlink()  # as if killed after logging started: the rerun runs it again
    second = run_and_store(cfg)
    assert second["status"] == "done"
    files = sorted(cell.rglob("run-*.wandb"))
    assert len(files) == 2 and run_id(files[0]) == run_id(files[1])
    s = summary(files[1])
    assert not [k for k in s if k.startswith("iter/")], "per-iteration series leaked into the summary"
    assert {"iter/physical_rows", "iter/kv_used_blocks"} <= history_keys(files[1])
    triggers = second["summary"]["prm_triggers"]
    assert triggers and all(json.loads(s[f"prm_triggers/{k}"]) == v for k, v in triggers.items())
    assert json.loads(s["provenance/host"]) == second["summary"]["provenance"]["host"]
    other = run_and_store(compose_cfg(f"results_dir={tmp_path}", "wandb.mode=offline", "experiment_name=wb",
                                      "policy=nonspec"))
    assert run_id(next(Path(other["cell_dir"]).rglob("run-*.wandb"))) != run_id(files[0])


def test_flatten_nested_values():
    assert flatten({"a": 1, "b": {"c": 2, "d": {"e": None}}, "f": [1, 2], "g": object()}) == {
        "a": 1, "b/c": 2, "b/d/e": None, "f": [1, 2]}
