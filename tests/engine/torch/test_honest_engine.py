"""The torch engine does the paper's work and its clock tells the truth (tiny pair, CPU):
the PRM prefix cache and the generator's prefix cache change cost, never the tree
(float64); the sim and synthetic-token mode count the same PRM tokens; makespan is the
serving loop's wall clock, host work included."""

from __future__ import annotations

import functools
import time

import pytest

from cfg_helpers import compose_cfg
from contract import EQUIVALENT, CheckedServer, assert_same_tree
from specscale.cell import build_server
from specscale.metrics.summary import summarize

TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=2", "search.temperature=1.0", "search.max_rounds=5", "search.step_token_cap=12",
    "search.path_token_cap=60", "wandb.mode=disabled", "beam=4", "expansion=2", "concurrency=2", "seed=2",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny ops, one thread


def checked(*overrides, base=TORCH):
    s = build_server(compose_cfg(*base, *overrides, small=False))
    s.__class__ = CheckedServer
    s.checks = 0
    rec = s.run()
    assert s.checks > 5
    assert rec.leaked_blocks == 0 and s.prm_cache.num_used == 0
    return s, rec


@functools.lru_cache(maxsize=None)
def run(*overrides):
    return checked(*overrides)[1]


def same(rec, ref, what):
    assert_same_tree(rec, ref, what, score_tol=1e-9)


@pytest.mark.parametrize("policy,extra", EQUIVALENT, ids=[p for p, _ in EQUIVALENT])
def test_prm_cache_keeps_the_tree(policy, extra):
    # Every policy with both caches on builds nonspec's tree with both off (the caches change
    # cost, never scores; test_backend_search holds the policies equal to each other).
    ref = run("policy=nonspec", "engine.prm_prefix_cache=false", "engine.prefix_caching=false")
    same(run(f"policy={policy}", *extra, "engine.prm_prefix_cache=true"), ref, f"{policy} with the PRM cache")


@pytest.mark.parametrize("policy,extra", [("nonspec", []), ("spec", []), ("full", ["policy.pruning=strict"])])
def test_preemption_with_both_caches_keeps_the_tree(policy, extra):
    one = ["n_problems=1", "concurrency=1", "seed=6"]
    ref = run(f"policy={policy}", *extra, *one)
    for gen_cache in ("true", "false"):
        small = run(f"policy={policy}", *extra, *one, "engine.kv_blocks=33", f"engine.prefix_caching={gen_cache}",
                    "engine.prm_kv_blocks=40")
        assert small.preemptions > 0
        same(small, ref, f"{policy} small pools, generator prefix caching {gen_cache}")


def test_prm_cache_computes_far_fewer_tokens():
    on, off = run("policy=nonspec"), run("policy=nonspec", "engine.prm_prefix_cache=false")
    tok = lambda rec: sum(b["n_tokens"] for b in rec.verify_batches)  # noqa: E731
    cached = sum(b["n_cached_tokens"] for b in on.verify_batches)
    wave = sum(b["n_head_wave_tokens"] for b in on.verify_batches)
    assert wave > 0  # round 0's tasks share their request's head: computed once, in a wave
    # The same inputs, split into cached and computed, plus each head computed once by its wave.
    assert tok(on) + cached == tok(off) + wave
    assert tok(on) < tok(off) / 2


def test_wall_clock_holds_host_time():
    s = build_server(compose_cfg(*TORCH, "policy=full", small=False))
    t0 = time.perf_counter()
    rec = s.run()
    outer = time.perf_counter() - t0
    out = summarize(rec, [60], 1)
    assert out["makespan_s"] >= out["time_generation_s"] + out["time_verification_s"]
    assert out["time_other_s"] > 0
    assert out["makespan_s"] == pytest.approx(outer, rel=0.05)


# ---------------------------------------------------------------- synthetic tokens vs sim
WORKLOAD = ["step_len_median=6.0", "steps_median=4.0", "content_vocab=64"]
COMMON = [
    "model=tiny", "dataset=fixture_math500", "n_problems=2", "progress=false", "wandb.mode=disabled",
    "search.max_rounds=6", "search.step_token_cap=24", "search.path_token_cap=96",
    "beam=4", "expansion=2", "concurrency=2", "seed=3", "engine.prm_kv_blocks=64",
]
SIM = ["engine=sim", *(f"engine.synthetic.{w}" for w in WORKLOAD)]
SYN = ["engine=torch", "engine.synthetic_tokens=true", "engine.dtype=float32", "engine.cpu_kv_blocks=512",
       *(f"engine.synthetic.{w}" for w in WORKLOAD)]


@pytest.mark.parametrize("cache", ["true", "false"])
@pytest.mark.parametrize("policy,extra", [("nonspec", []), ("full", ["policy.pruning=strict"])])
def test_sim_and_synthetic_tokens_count_the_same_prm_tokens(policy, extra, cache):
    args = [f"policy={policy}", *extra, f"engine.prm_prefix_cache={cache}"]
    # Plain runs: the invariants are checked elsewhere (checking the sim's full-size pool every
    # iteration would dominate this test).
    sim = build_server(compose_cfg(*COMMON, *SIM, *args, small=False)).run()
    syn = build_server(compose_cfg(*COMMON, *SYN, *args, small=False)).run()
    assert_same_tree(syn, sim, f"synthetic {policy}")
    for key in ("n_tokens", "n_cached_tokens", "n_tasks"):
        assert [b[key] for b in syn.verify_batches] == [b[key] for b in sim.verify_batches], key
