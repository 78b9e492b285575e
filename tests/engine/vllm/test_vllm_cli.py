"""run.py -m engine=vllm model=tiny_vllm policy=nonspec,spec,ep,full beam=4, through Hydra in a
fresh process (one vLLM engine pair serves the four cells), at reduced search size."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
