"""runners/bench_engines at reduced size: every part of its table is produced and consistent.
Its vLLM cells use the engine settings of test_vllm_engine.py, so a worker that runs both
modules starts one pair of vLLM engines."""
from __future__ import annotations

import json

import pytest

from runners import bench_engines


def test_bench_engines_reduced(tmp_path):
    path = tmp_path / "e.json"
    out = bench_engines.main([
        "--policies", "nonspec,full", "--n-problems", "1", "--beam", "4", "--max-rounds", "2", "--identity-problems", "2",
        "--decode", "4x16x4", "--vllm-set", "engine.max_model_len=512", "--vllm-set", "engine.kv_blocks=22",
        "--json", str(path),
    ])
    assert json.loads(path.read_text()) == json.loads(json.dumps(out, default=str))
    rows = out["policies"]
    assert [(r["engine"], r["policy"]) for r in rows] == [
        (e, p) for e in bench_engines.ENGINES for p in ("nonspec", "full")]
    for r in rows:
        assert r["output_tok_s"] > 0 and r["makespan_s"] > 0 and r["prm_tokens"] > 0
    for nonspec, full in zip(rows[::2], rows[1::2]):
        assert nonspec["ratio_output_tok_s"] == 1.0
        assert full["ratio_output_tok_s"] == pytest.approx(full["output_tok_s"] / nonspec["output_tok_s"])
        assert full["makespan_ratio"] == pytest.approx(nonspec["makespan_s"] / full["makespan_s"])
    by = {(r["engine"], r["policy"]): r for r in rows}
    # The PRM cache changes what torch's PRM computes, never the tree (same output tokens).
    assert by["torch", "nonspec"]["prm_tokens"] < by["torch_prm_off", "nonspec"]["prm_tokens"]
    assert by["torch", "nonspec"]["output_tokens"] == by["torch_prm_off", "nonspec"]["output_tokens"]
    assert set(out["identity"]) == {"spec", "ep_strict", "ep_cd_strict"} and out["identity_problems"] == 2
    assert all(0.0 <= v <= 1.0 for v in out["identity"].values())
    (dec,) = out["decode"]
    assert dec["shape"] == "4x16x4" and dec["torch_tok_s"] > 0 and dec["vllm_tok_s"] > 0
