"""LV (review Algorithm 3): each trigger fires in a constructed case; deferrals counted."""
from __future__ import annotations

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.settings.search_policy import PolicyConfig
from specscale.search.candidate import Candidate
from specscale.verify.queue import VerifyQueue

HUGE = 10**9


def _cand(cid, round_=0, position=0):
    return Candidate(cid=cid, key=cid, request_id=0, round=round_, child_index=0, parent=None,
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
    q.sibling_group_complete(0, 0)
    assert q.due(0.0)[0] == "siblings"


def test_deferral_limit_counts_generation_iterations():
    q = _lazy(d_max=3)
    t = q.add(0, [_cand(1)], 5, 0.0)
    for i in range(2):
        q.on_generation_iteration()
        assert q.due(0.0) is None
    assert q.deferrals(t) == 2
    q.on_generation_iteration()
    trigger, tasks = q.due(0.0)
    assert trigger == "deferrals" and tasks[0].deferrals == 3


def test_optional_age_cap():
    q = _lazy(age_cap_s=0.5)
    q.add(0, [_cand(1)], 5, 1.0)
    assert q.due(1.4) is None
    assert q.due(1.5)[0] == "age"


def test_cancelled_candidate_leaves_the_queue():
    q = _lazy(b_max=10)
    c = _cand(1)
    q.add(0, [c], 8, 0.0)
    q.drop(c)
    assert len(q) == 0 and q.pending_tokens == 0


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
