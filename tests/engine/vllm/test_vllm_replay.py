"""engine=vllm profiled from its own step timings: the per-iteration
features are what vLLM scheduled, the profile is written and loads, and the vLLM fidelity
check (vLLM's schedule replayed on the profile) writes a full CSV.

Cells use test_vllm_engine.py's engine settings (a 22-block generator pool, 512-token
window), so a worker running both modules starts one pair of vLLM engines; the small
pool makes vLLM preempt, so resumed prefills are covered too.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import fidelity
from runners import profile_vllm
from specscale.engine.cost_profile import CostProfile

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--n-problems", "3", "--set", "engine.kv_blocks=22"]


def test_features_are_what_vllm_scheduled():
    from specscale.cell import build_server
    from specscale.compose import compose_config

    server = build_server(compose_config([*profile_vllm.VLLM_SET, "policy=nonspec", "beam=4", "concurrency=3",
                                          "n_problems=3", "engine.kv_blocks=22", "seed=1"], resolve=True))
    rec = server.run()
    gen = [r for r in rec.iterations if r["kind"] == "generate"]
    ver = [r for r in rec.iterations if r["kind"] == "verify"]
    feats, batches = server.gen.iteration_features, server.backend.prm_engine.batches
    assert len(feats) == len(gen) > 10 and len(batches) == len(ver) > 3
    for f, r in zip(feats, gen):
        assert len(f.decode_ctx) == r["decode_rows"]
        assert sum(n for n, _ in f.prefill) == r["prefill_tokens"]
        assert f.logit_rows == r["physical_rows"] == len(f.decode_ctx) + len(f.prefill)
        assert all(1 < c <= 512 for c in f.decode_ctx)  # a prompt and the tokens so far; inside the window
    # vLLM's prefix-cache hits of the first prefills are what its requests report as cached
    # (nonspec aborts nothing); resumed prefills after a preemption may find cached blocks too.
    assert server.gen.total_preemptions > 0
    cached = sum(c for f in feats for _, c in f.prefill)
    assert cached >= server.gen.prefix_hit_tokens > 0
    # PRM batches: vLLM's own counts of what its PRM requests computed and read from cache.
    s = server.backend.summary_extras()
    assert sum(n for b in batches for n, _ in b.tasks) == s["vllm_prm_tokens_computed"]
    assert sum(len(b.tasks) for b in batches) == s["vllm_prm_requests"]
    assert sum(c for b in batches for _, c in b.tasks) == s["vllm_prm_tokens_cached"]


@pytest.fixture(scope="module")
def profile_yaml(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    assert profile_vllm.main(["--name", "t", "--cells", "nonspec:4:3,spec:4:3,full:2:3", *SMALL,
                              "--out-conf", str(out), "--out-table", str(out)]) == 0
    return out


def test_profile_written_and_loads(profile_yaml):
    conf = yaml.safe_load((profile_yaml / "t.yaml").read_text())
    prof = CostProfile.from_dict(conf["profile"])
    assert conf["name"] == "profiled:t" and re.match(r"vLLM \d+\.\d+", prof.device)
    assert prof.meta["engine"] == "vllm" and prof.meta["cells"] == ["nonspec:4:3", "spec:4:3", "full:2:3"]
    assert dict(prof.in_loop) == {"generation": 1.0, "prm": 1.0}
    assert all(c >= 0 for c in prof.generation.coef + prof.prm.coef) and sum(prof.generation.coef) > 0
    table = pd.read_parquet(profile_yaml / "t.parquet")
    assert set(table["cell"]) == {"nonspec b4 c3", "spec b4 c3", "full b2 c3"}
    assert (table["seconds"] > 0).all() and set(table["kind"]) == {"generate", "verify"}
    # The fit prices its own calls (how well is a benchmark's question: the fidelity check,
    # python -m analysis.fidelity --engine vllm, reports it; timings on a loaded machine vary).
    gen = table[table["kind"] == "generate"]
    pred = gen[[f"x_gen_{n}" for n in prof.generation.names]].to_numpy() @ np.asarray(prof.generation.coef)
    assert len(pred) == len(gen) and np.isfinite(pred).all() and (pred >= 0).all() and pred.sum() > 0


def test_vllm_fidelity_small_grid(profile_yaml, tmp_path, capsys):
    rc = fidelity.main(["--engine", "vllm", "--profile", str(profile_yaml / "t.yaml"), "--policies", "nonspec,spec",
                        "--beams", "4", "--concurrency", "3", "--reps", "1", *SMALL, "--results-dir", str(tmp_path)])
    assert rc == 0
    df = pd.read_csv(tmp_path / "fidelity" / "vllm" / "fidelity.csv")
    assert len(df) == 2 and not df.isna().any().any() and (df["trees"] == "n/a (replay)").all()
    assert (df["makespan_s_predicted"] > 0).all() and (df["iterations"] > 0).all()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"fidelity: 2 cells, median makespan error [\d.]+%, max [\d.]+%, trees n/a \(replay\)", last)
    sec = fidelity.build_section(tmp_path, tmp_path / "report")
    assert sec.tables[0][0].startswith("vLLM: makespan") and sec.notes[-1] == last
