"""The full search on the torch backend (tiny pair, CPU): the equivalence contract in
float64 (docs/design.md §4), CD saves forward rows without changing the tree, KV invariants and
no leaks with cancellations and preemption, every policy end to end."""

from __future__ import annotations

import functools

import pandas as pd
import pytest
import torch

from cfg_helpers import compose_cfg
from contract import EQUIVALENT, POLICIES, CheckedServer, frames
from contract import assert_same_tree as _same


def assert_same_tree(rec, ref, what):
    _same(rec, ref, what, score_tol=1e-9)  # float64 PRM: equal to ~1e-12

from specscale.cell import build_server, run_cell
from specscale.engine.torch import build as torch_build

# A small search on the real tiny models: 2 fixture problems, steps capped at 12 tokens
# (random weights rarely emit the delimiter), temperature 1.0 so siblings diverge.
TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=2", "search.temperature=1.0", "search.max_rounds=5", "search.step_token_cap=12",
    "search.path_token_cap=60", "wandb.mode=disabled",
]
CONFIGS = [
    ["beam=4", "expansion=2", "concurrency=1", "seed=1"],
    ["beam=4", "expansion=4", "concurrency=2", "seed=2"],
    ["beam=4", "expansion=2", "concurrency=2", "seed=3", "search.score_agg=min", "policy.b_max=64"],
]


@pytest.fixture(scope="module", autouse=True)
def shared_models():
    """Load the tiny models once per module; each cell still gets a fresh backend and KV pool."""
    loaded = {}
    real = torch_build.build_models

    def cached(cfg):
        eng = cfg["engine"]
        key = (eng.get("dtype"), cfg["model"]["generator"]["hf_name"], cfg["model"]["prm"]["hf_name"])
        if key not in loaded:
            loaded[key] = real(cfg)
        runner, prm = loaded[key]
        runner.allocate_kv_cache(torch_build._kv_blocks(cfg, runner, runner.device))
        return runner, prm

    mp = pytest.MonkeyPatch()
    mp.setattr(torch_build, "build_models", cached)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add sync cost (and stall on a busy machine)
    yield
    torch.set_num_threads(threads)
    mp.undo()


def cfg(*overrides):
    return compose_cfg(*TORCH, *overrides, small=False)


@functools.lru_cache(maxsize=None)
def run(*overrides):
    return build_server(cfg(*overrides)).run()




@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o))
def test_policies_build_identical_trees(overrides):
    ref = run("policy=nonspec", *overrides)
    rounds, _ = frames(ref)
    assert len(rounds) >= 2 * 3  # several rounds per request
    # Not a degenerate tree: members of a round differ in text and in score.
    assert any(len({tuple(t) for t in texts}) > 1 for texts in rounds["member_texts"])
    assert any(len(set(s)) > 1 for s in rounds["member_scores"])
    for policy, extra in EQUIVALENT[1:]:
        assert_same_tree(run(f"policy={policy}", *overrides, *extra), ref, policy)


def test_speculation_ran_ahead_and_cd_saved_rows():
    # Steps mostly end at the token cap, all together; speculation needs the few that
    # end early at a delimiter or EOS.
    base, spec = run("policy=nonspec", *CONFIGS[0]), run("policy=spec", *CONFIGS[0])
    drawn = lambda rec: sum(r["logical_draws"] for r in rec.iterations)
    assert drawn(spec) > drawn(base)
    assert sum(r["speculative_rows"] for r in spec.iterations) > 0
    rows = lambda rec: sum(r["physical_rows"] for r in rec.iterations)
    ovr = CONFIGS[1]
    for plain, dedup in [("nonspec", "nonspec_cd"), ("ep_cd", "ep_strict")]:
        a = run(f"policy={plain}", *ovr, *(["policy.pruning=strict"] if plain == "ep_cd" else []))
        b = run(f"policy={dedup}", *ovr)
        cd, no_cd = (a, b) if plain == "ep_cd" else (b, a)
        assert_same_tree(cd, no_cd, f"{plain} vs {dedup}")
        assert rows(cd) < rows(no_cd), (plain, rows(cd), rows(no_cd))


def checked_run(*overrides):
    s = build_server(cfg(*overrides))
    s.__class__ = CheckedServer
    s.checks = 0
    rec = s.run()
    assert s.checks > 10
    assert rec.leaked_blocks == 0 and rec.leaked_sequences == 0
    assert s.blocks.num_free == s.blocks.num_blocks
    return rec


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_without_leaks(policy):
    rec = checked_run(f"policy={policy}", "beam=4", "expansion=2", "concurrency=2", "seed=5")
    assert len(rec.requests) == 2 and all(r["logical_tokens"] > 0 for r in rec.requests)
    if policy in ("spec", "ep_strict", "ep", "ep_cd", "full", "adaptive"):
        assert rec.cancel_lifetimes  # losing speculative branches were cancelled and freed


@pytest.mark.parametrize("policy", ["nonspec", "spec", "fasttts", "full"])
def test_small_pool_forces_preemption_and_keeps_the_tree(policy):
    # One request: its prompt alone takes 29 of the 33 blocks (a whole path needs 33), so children and
    # speculation must preempt (and recompute from start 0) to make progress.
    base = [f"policy={policy}", "beam=4", "expansion=2", "concurrency=1", "n_problems=1", "seed=6"]
    if policy == "full":
        base.append("policy.pruning=strict")
    big = run(*base)
    small = checked_run(*base, "engine.kv_blocks=33")
    assert small.preemptions > 0 and small.kv_peak_blocks <= 33
    assert_same_tree(small, big, f"{policy} small pool")


def test_llama_pair_with_rlhflow_prm():
    llama = ["model.generator.hf_name=tiny/llama", "model.prm.hf_name=tiny/llama_prm",
             "model.prm.format=rlhflow_llama_prm", "beam=4", "expansion=2", "concurrency=2", "seed=7"]
    ref = run("policy=nonspec", *llama)
    assert_same_tree(run("policy=full", "policy.pruning=strict", *llama), ref, "full on the llama pair")
    scores = [s for row in ref.rounds for s in row["member_scores"]]
    assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) > 1


def test_context_window_ends_paths(tmp_path):
    """A generator whose window leaves ~20 tokens after the prompt: paths stop there with EOS."""
    import json
    import shutil

    from specscale.testbed.tiny_models import ensure_tiny_models

    src = ensure_tiny_models()["qwen2"]
    dst = tmp_path / "qwen2-short"
    shutil.copytree(src, dst)
    conf = json.loads((dst / "config.json").read_text())
    conf["max_position_embeddings"] = 500  # fixture prompts are 448..485 tokens
    (dst / "config.json").write_text(json.dumps(conf))
    rec = build_server(cfg("policy=spec", f"model.generator.hf_name={dst}", "beam=4", "n_problems=2",
                           "search.step_token_cap=8", "search.max_rounds=10")).run()
    assert rec.leaked_blocks == 0
    rounds = pd.DataFrame(rec.rounds)
    last = rounds.sort_values("round").groupby("request_id").tail(1)
    assert all(all(t) for t in last["member_terminal"])  # every path ended, none ran past the window


def test_run_cell_writes_results(tmp_path):
    summary = run_cell(cfg("policy=full", "beam=4", "n_problems=1"), tmp_path)
    assert summary["engine"] == "torch" and summary["leaked_blocks"] == 0
    # The device it ran on, not the hardware config (a CPU run once said A100-SXM4-80GB).
    device = summary["provenance"]["device"]
    assert summary["hardware"] == device["name"] and device["type"] == "cpu"
    assert summary["provenance"]["dataset"]["rows"] == 1 and summary["provenance"]["dataset"]["rows_fingerprint"]
    # engine.attention=auto on the CPU: both models ran the portable torch path, and say so.
    assert summary["provenance"]["attention"] == {"generator": {"path": "torch"}, "prm": {"path": "torch"}}
    assert summary["makespan_s"] > 0 and summary["throughput_tok_s"] > 0
    # Both KV pools are reported (the PRM pool exists: engine.prm_prefix_cache defaults to true).
    assert summary["memory_gen_blocks"] > 0 and summary["kv_blocks_total"] > 0
    assert summary["memory_prm_blocks"] > 0 and summary["prm_kv_blocks_total"] > 0 and summary["warmup_s"] >= 0
    for name in ("summary.json", "rounds.parquet", "iterations.parquet", "requests.parquet"):
        assert (tmp_path / name).is_file()
    it = pd.read_parquet(tmp_path / "iterations.parquet")
    assert (it["seconds"] > 0).all()  # measured, not modelled


def test_adaptive_cells_start_from_a_timed_prm_curve():
    """policy=adaptive on torch: the build times PRM batches before serving, and the
    monitor's curve starts from those points (no blind first decisions)."""
    cfg = compose_cfg(*TORCH, "policy=adaptive", "beam=4", "expansion=2", "concurrency=2", "seed=5")
    server = build_server(cfg)
    profile = server.backend.prm_profile
    tokens = [n for n, _ in profile]
    assert len(profile) >= 2 and tokens == sorted(tokens) and all(t > 0 for _, t in profile)
    curve = server.adaptive.measured_curve
    assert curve.count == len(profile) and curve.alpha + curve.beta * tokens[-1] > 0
    assert not build_server(compose_cfg(*TORCH, "policy=full")).backend.prm_profile
