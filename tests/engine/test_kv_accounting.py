"""KV accounting: invariants after every iteration, nothing leaked, preemption is harmless."""
from __future__ import annotations

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from contract import POLICIES
from contract import assert_same_tree
from contract import checked as _checked
from specscale.cell import build_server


def checked(cfg):
    return _checked(build_server(cfg))


@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_hold_and_nothing_leaks(policy):
    s = checked(compose_cfg(f"policy={policy}", "beam=8", "seed=11"))
    rec = s.run()
    assert s.checks > 50
    assert rec.leaked_blocks == 0 and rec.leaked_sequences == 0
    assert s.blocks.num_free == s.blocks.num_blocks


def test_cancelled_subtrees_are_freed_under_speculation():
    s = checked(compose_cfg("policy=spec", "beam=8", "seed=12"))
    rec = s.run()
    assert len(rec.cancel_lifetimes) > 10  # losing branches were cancelled, and each check passed
    assert rec.leaked_blocks == 0


@pytest.mark.parametrize("policy", ["spec", "full", "nonspec"])
def test_small_pool_forces_preemption_and_keeps_the_tree(policy):
    base = ["beam=8", "seed=13", "concurrency=4", f"policy={policy}"]
    big = build_server(compose_cfg(*base)).run()
    s = checked(compose_cfg(*base, "engine.kv_blocks=40"))
    small = s.run()
    assert small.preemptions > 0
    assert small.kv_peak_blocks <= 40
    cols = ["request_id", "round", "member_keys", "member_texts", "member_scores", "selected_keys"]
    if policy != "full":  # the shortcut is timing-dependent; strict policies must match exactly
        a = pd.DataFrame(big.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)[cols]
        b = pd.DataFrame(small.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)[cols]
        pd.testing.assert_frame_equal(a, b)


def test_speculative_descendants_past_the_budget_preempt_and_strict_speculation_keeps_nonspec_tree():
    """A pool that nonspec fills without preemption: speculation's descendants hold KV
    until their parent's verdict cancels them, so the same pool must preempt under
    spec, and spec (strict) must still build nonspec's tree."""
    base = ["beam=8", "seed=14", "concurrency=4"]
    ref = build_server(compose_cfg("policy=nonspec", *base)).run()
    pool = f"engine.kv_blocks={ref.kv_peak_blocks}"
    fits = checked(compose_cfg("policy=nonspec", *base, pool)).run()
    assert fits.preemptions == 0
    s = checked(compose_cfg("policy=spec", *base, pool))
    spec = s.run()
    assert spec.preemptions > 0
    assert spec.kv_peak_blocks <= ref.kv_peak_blocks and spec.leaked_blocks == 0
    assert any(it["preempted"] and it["speculative_rows"] for it in spec.iterations if it["kind"] == "generate")
    assert_same_tree(spec, ref, "spec at a pool its speculative descendants overflow")
