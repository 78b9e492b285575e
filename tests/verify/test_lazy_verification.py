"""Lazy verification (the paper's Algorithm 3) on constructed queues: each trigger fires
alone; a completed sibling group flushes its own tasks (plus what fits under B_max) or
everything; the volume counts scoring inputs or new tokens; deferrals count decisions or
generation iterations; B_max changes what a batch holds. Then in full runs."""
from __future__ import annotations

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.settings.search_policy import PolicyConfig
from specscale.search.candidate import Candidate
from specscale.verify.queue import VerifyQueue

HUGE = 10**9


ROOT = Candidate(cid=0, key=0, request_id=0, round=-1, child_index=0, parent=None, path_tokens_before=0)


def _cand(cid, round_=0, position=0, parent=ROOT):
    return Candidate(cid=cid, key=cid, request_id=0, round=round_, child_index=0, parent=parent,
                     path_tokens_before=0, position=position)


def _lazy(**kw) -> VerifyQueue:
    base = dict(name="t", speculation="naive", pruning="shortcut", dedup=True, verification="lazy",
                b_max=HUGE, d_max=HUGE, sibling_trigger=False)
    base.update(kw)
    return VerifyQueue(PolicyConfig(**base))


def test_token_threshold():
    q = _lazy(b_max=100)
    q.add(0, [_cand(1)], 60, 0.0)
    assert q.due(0.0) is None
    q.add(0, [_cand(2)], 40, 0.0)
    trigger, tasks = q.due(0.0)
    assert trigger == "tokens" and len(tasks) == 2 and len(q) == 0 and q.pending_tokens == 0


def test_sibling_group():
    q = _lazy(sibling_trigger=True)
    q.add(0, [_cand(1)], 5, 0.0)
    assert q.due(0.0) is None
    q.sibling_group_complete(0, 0, ROOT.cid)
    assert q.due(0.0)[0] == "siblings"


def _two_groups(flush: str):
    """Pending: an old task of parent A's group, three of parent B's; then B's group
    completes (A's has not)."""
    a, b = _cand(100, round_=0), _cand(200, round_=0)
    q = _lazy(sibling_trigger=True, lv_sibling_flush=flush)
    old = q.add(0, [_cand(1, 1, parent=a)], 4, 0.0, input_tokens=20)
    kids = [q.add(0, [_cand(2 + i, 1, parent=b)], 4, 0.0, input_tokens=10) for i in range(3)]
    assert q.due(0.0) is None
    q.sibling_group_complete(0, 1, b.cid)
    return q, old, kids


def test_a_completed_group_flushes_only_its_own_tasks():
    q, old, kids = _two_groups("group")
    trigger, tasks = q.due(0.0)
    assert trigger == "siblings" and tasks == kids and list(q.pending.values()) == [old]
    assert q.pending_input_tokens == 20
    assert q.due(0.0) is None  # the group's trigger is spent: the old task waits for its own


def test_flush_all_takes_every_pending_task():
    q, old, kids = _two_groups("all")
    trigger, tasks = q.due(0.0)
    assert trigger == "siblings" and set(tasks) == {old, *kids} and len(q) == 0


def test_a_completed_group_with_nothing_pending_does_not_flush():
    q, old, kids = _two_groups("group")
    for k in kids:
        q.drop(k.candidates[0])  # all cancelled (pruned) before the decision
    assert q.due(0.0) is None and list(q.pending.values()) == [old]


def test_volume_counts_scoring_inputs_or_new_tokens():
    for volume, fires in (("input", True), ("new", False)):
        q = _lazy(b_max=100, lv_volume=volume)
        q.add(0, [_cand(1)], 10, 0.0, input_tokens=60)  # a 10-token step on a 50-token cached prefix
        q.add(0, [_cand(2)], 10, 0.0, input_tokens=60)
        assert (q.volume, q.pending_tokens, q.pending_input_tokens) == ((120 if fires else 20), 20, 120)
        due = q.due(0.0)
        assert (due is not None and due[0] == "tokens") == fires


def test_b_max_changes_what_a_batch_holds():
    """Steps of 10 input tokens arrive one per decision; the batch is what B_max lets gather."""
    sizes = {}
    for b_max in (25, 45):
        q = _lazy(b_max=b_max)
        for i in range(10):
            q.add(0, [_cand(1 + i)], 2, 0.0, input_tokens=10)
            due = q.due(0.0)
            if due is not None:
                sizes[b_max] = len(due[1])
                break
    assert sizes == {25: 3, 45: 5}


def test_deferrals_count_decisions_that_passed_a_task_over():
    q = _lazy(d_max=3, lv_deferral="decisions")
    t = q.add(0, [_cand(1)], 5, 0.0)
    for _ in range(2):
        assert q.due(0.0) is None  # no generation iteration in between: decisions still count
    assert q.deferrals(t) == 2
    assert q.due(0.0) is None
    trigger, tasks = q.due(0.0)
    assert trigger == "deferrals" and tasks[0].deferrals == 3


def test_a_group_flush_passes_the_others_over():
    q, old, kids = _two_groups("group")
    before = q.deferrals(old)
    q.due(0.0)  # flushes B's group only
    assert q.deferrals(old) == before + 1


def test_deferral_limit_counts_generation_iterations():
    q = _lazy(d_max=3, lv_deferral="iterations")
    t = q.add(0, [_cand(1)], 5, 0.0)
    for i in range(2):
        q.on_generation_iteration()
        assert q.due(0.0) is None
    assert q.deferrals(t) == 2
    q.on_generation_iteration()
    trigger, tasks = q.due(0.0)
    assert trigger == "deferrals" and tasks[0].deferrals == 3


@pytest.mark.parametrize("key, value", [("lv_volume", "output"), ("lv_sibling_flush", "some"),
                                        ("lv_deferral", "seconds")])
def test_unknown_readings_are_refused(key, value):
    with pytest.raises(ValueError, match=f"policy.{key} must be one of"):
        _lazy(**{key: value})


def test_optional_age_cap():
    q = _lazy(age_cap_s=0.5)
    q.add(0, [_cand(1)], 5, 1.0)
    assert q.due(1.4) is None
    assert q.due(1.5)[0] == "age"


def test_cancelled_candidate_leaves_the_queue():
    q = _lazy(b_max=10)
    c = _cand(1)
    q.add(0, [c], 8, 0.0, input_tokens=30)
    q.drop(c)
    assert len(q) == 0 and q.pending_tokens == 0 and q.pending_input_tokens == 0


@pytest.mark.parametrize(
    "overrides, trigger",
    [
        (["policy.b_max=64", "policy.d_max=1000000", "policy.sibling_trigger=false"], "tokens"),
        (["policy.b_max=1000000000", "policy.d_max=1000000"], "siblings"),
        (["policy.b_max=1000000000", "policy.d_max=2", "policy.sibling_trigger=false"], "deferrals"),
        (["policy.b_max=1000000000", "policy.d_max=1000000", "policy.sibling_trigger=false"], "idle"),
    ],
)
def test_each_trigger_fires_in_a_full_run(overrides, trigger):
    rec = build_server(compose_cfg("policy=full", *overrides)).run()
    vb = pd.DataFrame(rec.verify_batches)
    assert (vb["trigger"] == trigger).any(), vb["trigger"].value_counts().to_dict()
    if trigger == "deferrals":
        assert vb.loc[vb["trigger"] == "deferrals", "max_deferrals"].min() >= 2
    if trigger == "idle":  # only the no-generation-work trigger can flush
        assert set(vb["trigger"]) == {"idle"}


def test_lv_batches_are_fewer_and_larger_than_immediate():
    lazy = pd.DataFrame(build_server(compose_cfg("policy=full", "policy.b_max=256")).run().verify_batches)
    imm = pd.DataFrame(build_server(compose_cfg("policy=ep_cd")).run().verify_batches)
    assert len(lazy) < len(imm)
    assert lazy["n_tokens"].mean() > imm["n_tokens"].mean()
