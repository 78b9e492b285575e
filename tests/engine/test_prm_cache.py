"""The PRM prefix cache (specscale/engine/prm_cache.py) on the simulated backend: the
same tree with the cache on and off, invariants after every iteration, nothing held at
the end, evictions under a small pool, and token counts that follow the plan."""
from __future__ import annotations

import pytest

from cfg_helpers import compose_cfg
from contract import EQUIVALENT, POLICIES, assert_same_tree
from contract import checked as _checked
from specscale.cell import build_server


def run_checked(*overrides):
    s = _checked(build_server(compose_cfg(*overrides)))
    rec = s.run()
    assert s.prm_cache.num_used == 0 and not s.prm_cache.entries, "PRM blocks held after the run"
    assert rec.leaked_blocks == 0
    return s, rec


@pytest.mark.parametrize("policy", POLICIES)
def test_prm_invariants_hold_for_every_policy(policy):
    s, rec = run_checked(f"policy={policy}", "beam=8", "seed=21")
    assert s.checks > 30
    assert rec.prm_stats.cached_tokens > 0  # children really read their parents' prefixes


@pytest.mark.parametrize("policy,extra", EQUIVALENT)
def test_same_tree_cache_on_and_off(policy, extra):
    base = [f"policy={policy}", "beam=8", "seed=22", *extra]
    ref = run_checked("policy=nonspec", "beam=8", "seed=22", "engine.prm_prefix_cache=false")[1]
    for variant in (["engine.prm_prefix_cache=true"], ["engine.prm_prefix_cache=false"],
                    ["engine.prm_prefix_cache=true", "engine.prm_kv_blocks=12"],
                    ["engine.prm_prefix_cache=true", "engine.kv_blocks=40", "engine.prefix_caching=false"],
                    ["engine.prm_prefix_cache=true", "engine.kv_blocks=40", "engine.prefix_caching=true"]):
        _, rec = run_checked(*base, *variant)
        assert_same_tree(rec, ref, f"{policy} {variant}")


def test_small_pool_evicts_and_still_fits():
    _, big = run_checked("policy=full", "beam=8", "seed=23", "policy.pruning=strict")
    _, small = run_checked("policy=full", "beam=8", "seed=23", "policy.pruning=strict", "engine.prm_kv_blocks=6")
    assert small.prm_stats.evictions > 0 or small.prm_stats.uncached_tasks > 0
    assert small.prm_stats.peak_blocks <= 6
    assert_same_tree(small, big, "small PRM pool")
    # Evicted prefixes are recomputed: more PRM tokens, never fewer.
    assert sum(b["n_tokens"] for b in small.verify_batches) > sum(b["n_tokens"] for b in big.verify_batches)


def test_a_pool_of_one_block_runs_every_task_uncached():
    _, rec = run_checked("policy=spec", "beam=4", "seed=24", "engine.prm_kv_blocks=1")
    assert rec.prm_stats.uncached_tasks > 0


def test_token_counts_follow_the_paths():
    """Cache off: every task computes its whole path + closing; on: only what lies after
    the cached ancestor (never more than off, and far less once paths are long)."""
    s_off, off = run_checked("policy=nonspec", "beam=4", "seed=25", "engine.prm_prefix_cache=false")
    closing = s_off.backend.prm_closing_tokens
    assert closing == 2  # model.prm_format.closing_tokens of the default pair
    on_server, on = run_checked("policy=nonspec", "beam=4", "seed=25")
    tok_off = sum(b["n_tokens"] for b in off.verify_batches)
    tok_on = sum(b["n_tokens"] for b in on.verify_batches)
    assert tok_on < tok_off
    cached = sum(b["n_cached_tokens"] for b in on.verify_batches)
    # Cache off reads nothing cached, on: new + cached = the whole inputs, as off computed,
    # plus the heads computed once by head waves (then read by every task that shares them).
    assert sum(b["n_cached_tokens"] for b in off.verify_batches) == 0
    wave = sum(b["n_head_wave_tokens"] for b in on.verify_batches)
    assert tok_on + cached == tok_off + wave
    # nonspec scores each request's round 0 in one batch: one head wave per request.
    heads = {r.request_id: on_server.backend.prm_path_tokens(r.search.root) for r in on_server.finished}
    assert wave == sum(heads.values())


def test_head_wave_computes_a_shared_head_once():
    """A batch whose tasks share a head nothing has cached computes the head in a wave of
    its own; with the wave, PRM tokens are the head once plus each task's new part."""
    server, rec = run_checked("policy=nonspec", "beam=4", "seed=26", "n_problems=1")
    first = rec.verify_batches[0]
    head = server.backend.prm_path_tokens(server.finished[0].search.root)
    assert first["n_head_wave_tokens"] == head
    assert first["n_cached_tokens"] == head * first["n_tasks"]


def test_pool_sizes_follow_the_memory_plan():
    on = build_server(compose_cfg("policy=nonspec"))
    off = build_server(compose_cfg("policy=nonspec", "engine.prm_prefix_cache=false"))
    assert on.prm_cache.enabled and on.prm_cache.num_blocks > 0
    assert not off.prm_cache.enabled
    # Without a PRM KV pool the generator gets the memory (less the PRM's activation headroom).
    assert off.blocks.num_blocks > on.blocks.num_blocks


def test_members_merged_by_deduplication_keep_the_verified_prefix():
    """CD scores identical steps once; the search may then select any of the merged
    members, and each member's children must extend the verified prefix. Without an
    entry per member a selected non-head member's children recompute its whole step,
    and CD computes more PRM tokens than nonspec on the same tree."""
    common = ["beam=8", "seed=3", "n_problems=8", "engine.synthetic.identical_step_rate=0.3"]
    ns_server, ns = run_checked("policy=nonspec", *common)
    cd_server, cd = run_checked("policy=nonspec_cd", *common)
    assert_same_tree(cd, ns, "nonspec_cd with determined steps")
    merged_tasks = sum(b["n_tasks"] for b in ns.verify_batches) - sum(b["n_tasks"] for b in cd.verify_batches)
    assert merged_tasks > 0  # CD merged identical steps into fewer tasks
    tokens = lambda rec: sum(b["n_tokens"] for b in rec.verify_batches)  # noqa: E731
    assert tokens(cd) < 0.9 * tokens(ns)
    assert cd.prm_stats.cached_tokens > 0
