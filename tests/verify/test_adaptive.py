"""Adaptive verification: the flush rule on constructed states, its inputs on
constructed queue states, and runs on the simulated backend."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from contract import assert_same_tree
from specscale.cell import build_server
from specscale.settings.search_policy import PolicyConfig
from specscale.engine.sequence import PhysicalSequence
from specscale.engine.sim.cost_model import CostModel
from specscale.search.candidate import Candidate, Status
from specscale.search.round import Round
from specscale.verify.adaptive import FlushState, cancel_probability, flush_terms, memory_pressure, should_flush
from specscale.verify.adaptive_monitor import AdaptiveMonitor, subtree_load
from specscale.verify.prm_curve import MeasuredPRMCurve
from specscale.verify.queue import VerifyQueue


@pytest.fixture(scope="module")
def prm_cost():
    # The rule's scenarios below are sized for a PRM curve whose efficiency is half at
    # 128 tokens (pinned here, so the roofline profile's guess can move without them).
    cfg = compose_cfg()
    return CostModel.from_configs(cfg["model"], cfg["hardware"], {"prm_half_efficiency_tokens": 128.0}).prm_seconds


def _state(prm_cost, n=400, a=100, **kw) -> FlushState:
    """Pending PRM tasks of 40 new tokens on 300 cached, one iteration of 30 ms over 64 rows."""
    now = [(40, 300)] * (n // 40)
    later = now + [(40, 300)] * (a // 40)
    base = dict(pending_tokens=n, arrival_tokens=a, flush_now_s=prm_cost(now), flush_later_s=prm_cost(later),
                iteration_s=0.03, rows=64, doomed_rows=0.0, doomed_blocks=0.0, free_blocks=5000, block_demand=4.0)
    base.update(kw)
    return FlushState(**base)


# ---------------------------------------------------------------------- the rule
def test_nothing_to_lose_waits_while_batching_gains(prm_cost):
    t = flush_terms(_state(prm_cost))
    assert t.waste_s == 0 and t.memory_s == 0 and t.gain_s > 0 and not t.flush


def test_waste_alone_triggers(prm_cost):
    s = _state(prm_cost, doomed_rows=40.0)
    t = flush_terms(s)
    assert t.memory_s == 0 and t.waste_s == pytest.approx(40 * 0.03 / 64) and t.flush
    assert not should_flush(replace(s, doomed_rows=0.1))  # a little waste does not pay for a small batch


def test_memory_alone_triggers_only_under_pressure(prm_cost):
    s = _state(prm_cost, doomed_blocks=60.0, free_blocks=3, block_demand=6.0)
    t = flush_terms(s)
    assert t.waste_s == 0 and t.memory_s > t.gain_s and t.flush
    roomy = flush_terms(replace(s, free_blocks=5000))
    assert roomy.memory_s == 0 and not roomy.flush
    assert memory_pressure(6, 6) == pytest.approx(0.5) and memory_pressure(0, 6) > 0.99


def test_gain_shrinks_as_the_batch_grows(prm_cost):
    gains = [flush_terms(_state(prm_cost, n=n)).gain_s for n in (80, 400, 2000, 8000)]
    assert gains == sorted(gains, reverse=True) and gains[-1] < gains[0] / 10
    # The same waste waits on a small batch and flushes a large one: the threshold emerges.
    assert not should_flush(_state(prm_cost, n=80, doomed_rows=4.0))
    assert should_flush(_state(prm_cost, n=8000, doomed_rows=4.0))


def test_a_cheap_flush_never_waits(prm_cost):
    # A linear PRM curve (no fixed cost): batching saves nothing, so nothing justifies waiting.
    linear = _state(prm_cost, flush_now_s=0.004, flush_later_s=0.004 * 500 / 400)
    t = flush_terms(linear)
    assert t.gain_s == pytest.approx(0, abs=1e-15) and t.flush
    assert should_flush(_state(prm_cost, arrival_tokens=0, flush_later_s=_state(prm_cost).flush_now_s))  # nothing arrives


def test_cancel_probability_from_the_runs_scores():
    seen = sorted([0.1, 0.2, 0.3, 0.5, 0.5, 0.9])
    assert cancel_probability(0.5, seen, keep=2, members=8) == pytest.approx(3 / 6)  # ties at τ survive
    assert cancel_probability(None, seen, keep=2, members=8) == pytest.approx(0.75)  # no threshold: base rate
    assert cancel_probability(0.5, [], keep=2, members=8) == pytest.approx(0.75)


def test_measured_curve_fits_the_timed_batches():
    curve = MeasuredPRMCurve()
    assert curve([(100, 0)]) == 0.0  # nothing timed yet: waiting gains nothing
    curve.observe(200, 0.05)
    assert curve.alpha == pytest.approx(0.05) and curve.beta == 0.0  # one size: all fixed cost
    exact = MeasuredPRMCurve()  # affine timings are recovered exactly
    for n in (200, 400, 1000, 3000):
        exact.observe(n, 0.02 + 1.5e-5 * n)
    assert exact.alpha == pytest.approx(0.02) and exact.beta == pytest.approx(1.5e-5)
    assert exact([(600, 50), (400, 0)]) == pytest.approx(0.02 + 1.5e-5 * 1000)

# ---------------------------------------------------------------------- constructed queue states
@dataclass
class _Search:  # the two attributes of RequestSearch the monitor reads
    rounds: list
    done: bool = False
    active: dict = field(default_factory=dict)


def _round(members_scores, step_len=40):
    """Round 0 of request 0: 4 members of one root, each a finished step holding its KV;
    the given scores are delivered (verified), the others pending."""
    root = Candidate(cid=0, key=0, request_id=0, round=-1, child_index=0, parent=None, path_tokens_before=0,
                     status=Status.DONE)
    ms = [Candidate(cid=i + 1, key=i + 1, request_id=0, round=0, child_index=i, parent=root, path_tokens_before=0,
                    status=Status.DONE, step_tokens=[7] * step_len, holds_kv=True, end_time=0.0) for i in range(4)]
    rd = Round.open(0, ms)
    for m, s in zip(ms, members_scores):
        if s is not None:
            m.score = s
            rd.verified.append(m)
    return rd, ms


def _speculate(parent: Candidate, n_children: int, step_pos: int, shared: bool = False) -> None:
    """Children of `parent` decoding speculatively (round unknown), one row each or one shared row (CD)."""
    kids = [Candidate(cid=100 * parent.cid + j, key=j, request_id=0, round=1, child_index=j, parent=parent,
                      path_tokens_before=40, status=Status.RUNNING) for j in range(n_children)]
    seqs = [PhysicalSequence(sid=k.cid, request_id=0, admit_order=0, tokens=[], hist_hash=0, step_pos=step_pos)
            for k in (kids[:1] if shared else kids)]
    for j, k in enumerate(kids):
        seq = seqs[0 if shared else j]
        seq.members.append(k)
        k.phys = seq
        parent.children[j] = k


def _queue(rd, ms, pending, prm_cost, free_blocks=5000, scores=(0.2, 0.4, 0.6, 0.95), keep=1, rows=32):
    """A queue in adaptive mode over round `rd`; the monitor has seen one generation
    iteration (30 ms, `rows` rows, 80 PRM tokens enqueued) and the run's `scores`."""
    monitor = AdaptiveMonitor(prm_cost, block_size=16, keep=keep, pruning="strict")
    monitor.on_generation(0.03, logit_rows=rows, decode_rows=rows, prefill_tokens=0, enqueued_tokens=80)
    monitor.on_scores(scores)
    search = _Search([rd])
    policy = PolicyConfig(name="t", speculation="naive", pruning="strict", dedup=True, verification="adaptive")
    q = VerifyQueue(policy, lambda q: monitor.decide(q.pending.values(), q.pending_tokens, {0: search}.get,
                                                     free_blocks))
    for i in pending:
        q.add(0, [ms[i]], 40, 0.0)
    return q, monitor


def test_subtree_load_counts_rows_by_member_share():
    rd, ms = _round([None] * 4)
    _speculate(ms[0], 4, step_pos=20)
    _speculate(ms[1], 4, step_pos=20, shared=True)
    assert subtree_load(ms[0], 16) == (4.0, 3 + 4 * 2)  # own step (40 tokens: 3 blocks) + 2 per child
    assert subtree_load(ms[1], 16) == (1.0, 3 + 2)  # one shared row
    assert subtree_load(ms[2], 16) == (0.0, 3)


def test_speculative_work_under_doubtful_tasks_flushes(prm_cost):
    rd, ms = _round([0.9, None, None, None])  # K = 1: τ = 0.9, 3 of the 4 run scores fall below
    for i in (1, 2, 3):
        _speculate(ms[i], 4, step_pos=20)
    q, monitor = _queue(rd, ms, [1, 2, 3], prm_cost, rows=16)  # 12 of 16 rows hang on the pending scores
    trigger, tasks = q.due(0.0)
    assert trigger == "adaptive" and len(tasks) == 3
    assert monitor.last.waste_s == pytest.approx(0.75 * 12 * 0.03 / 16) and monitor.last.memory_s == 0
    # The same tasks when the doomed rows are a small share of a large batch: batching wins.
    q, monitor = _queue(rd, ms, [1, 2, 3], prm_cost, rows=256)
    assert q.due(0.0) is None and 0 < monitor.last.waste_s < monitor.last.gain_s


def test_without_speculative_work_only_the_sibling_trigger_flushes(prm_cost):
    rd, ms = _round([0.9, None, None, None])
    q, monitor = _queue(rd, ms, [1, 2], prm_cost)  # finished, held, nothing decoding below them
    assert q.due(0.0) is None
    assert monitor.last.waste_s == 0 and monitor.last.memory_s == 0
    q.sibling_group_complete(0, 0, 0)
    assert q.due(0.0)[0] == "siblings"


def test_held_kv_under_memory_pressure_flushes(prm_cost):
    rd, ms = _round([0.9, None, None, None], step_len=160)  # 10 blocks held by each pending step
    assert _queue(rd, ms, [1, 2, 3], prm_cost, free_blocks=5000)[0].due(0.0) is None
    q, monitor = _queue(rd, ms, [1, 2, 3], prm_cost, free_blocks=0)
    assert q.due(0.0)[0] == "adaptive" and monitor.last.waste_s == 0 and monitor.last.memory_s > 0


def test_a_speculative_rounds_task_is_not_priced(prm_cost):
    rd, ms = _round([0.9, None, None, None])
    _speculate(ms[1], 4, step_pos=20)
    child = ms[1].children[0]
    child.status, child.step_tokens = Status.DONE, [7] * 20
    _speculate(child, 4, step_pos=30)  # decoding under a task whose own round is unknown
    q, monitor = _queue(rd, ms, [], prm_cost)
    q.add(0, [child], 40, 0.0)
    assert q.due(0.0) is None and monitor.last.waste_s == 0


def test_adaptive_mode_needs_its_rule():
    with pytest.raises(ValueError, match="policy.verification=adaptive"):
        VerifyQueue(PolicyConfig(name="t", speculation="naive", verification="adaptive"))


# ---------------------------------------------------------------------- runs
def test_adaptive_flushes_by_price_in_a_speculative_run():
    ovr = ["beam=8", "concurrency=16", "seed=2"]
    ada = pd.DataFrame(build_server(compose_cfg("policy=adaptive", *ovr)).run().verify_batches)
    imm = pd.DataFrame(build_server(compose_cfg("policy=ep_cd", *ovr)).run().verify_batches)
    assert (ada["trigger"] == "adaptive").any(), ada["trigger"].value_counts().to_dict()
    assert set(ada["trigger"]) <= {"adaptive", "siblings", "idle", "memory"}
    assert len(ada) < len(imm) and ada["n_tokens"].mean() > imm["n_tokens"].mean()


def test_without_speculation_adaptive_degenerates_to_sibling_and_idle():
    ovr = ["beam=8", "concurrency=4", "seed=3"]
    rec = build_server(compose_cfg("policy=nonspec_cd", "policy.verification=adaptive", *ovr)).run()
    triggers = set(pd.DataFrame(rec.verify_batches)["trigger"])
    assert triggers <= {"siblings", "idle"} and "siblings" in triggers
    assert_same_tree(rec, build_server(compose_cfg("policy=nonspec", *ovr)).run(), "nonspec_cd + adaptive")


def test_age_cap_stays_a_safeguard():
    rec = build_server(compose_cfg("policy=adaptive", "policy.sibling_trigger=false", "policy.age_cap_s=0.001",
                                   "beam=8", "concurrency=4", "seed=4")).run()
    assert "age" in set(pd.DataFrame(rec.verify_batches)["trigger"])
