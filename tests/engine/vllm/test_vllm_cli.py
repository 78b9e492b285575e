"""run.py -m engine=vllm model=tiny_vllm policy=nonspec,spec,ep,full beam=4, through Hydra in a
fresh process (one vLLM engine pair serves the four cells), at reduced search size; with a sim and a torch cell added,
`specscale show` labels the three engine kinds."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from cfg_helpers import SMALL
from specscale.results import glance

ROOT = Path(__file__).resolve().parents[3]


def test_multirun_every_policy(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "engine=vllm", "model=tiny_vllm", "policy=nonspec,spec,ep,full", "beam=4",
         "n_problems=2", "search.max_rounds=3", "search.step_token_cap=12", "search.path_token_cap=48",
         "progress=false", f"results_dir={tmp_path}", "wandb.mode=disabled"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {json.loads(p.read_text())["policy"]: json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")}
    assert set(summaries) == {"nonspec", "spec", "ep", "full"}
    for s in summaries.values():
        assert s["engine"] == "vllm" and s["engine_features"]["engine"] == "vllm"
        assert s["output_tok_s"] > 0 and s["leaked_blocks"] == 0
    assert summaries["full"]["engine_features"]["token_level_cd_requested"] is True

    # The same store, with a sim and a torch cell beside the vLLM ones: `specscale show`
    # labels each engine kind (how the numbers were obtained).
    for engine in (["engine=sim"], ["engine=torch", "model=tiny", "dataset=fixture_math500"]):
        other = subprocess.run([sys.executable, "run.py", *SMALL, *engine, "policy=nonspec", f"results_dir={tmp_path}",
                                "wandb.mode=disabled"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert other.returncode == 0, other.stderr[-2000:]
    csv = tmp_path / "show.csv"
    assert glance.main([str(tmp_path), "--csv", str(csv)]) == 0
    kinds = set(pd.read_csv(csv)["measured"])
    assert any(k.startswith("measured: vLLM ") for k in kinds), kinds
    assert any(k.startswith("measured: torch on ") for k in kinds), kinds
    assert any(k.startswith("simulated (roofline ") for k in kinds), kinds
