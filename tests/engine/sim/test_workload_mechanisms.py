"""The synthetic workload's mechanisms that search and deduplication depend on:
determined (identical) sibling steps, sibling errors correlated through their parent,
and a hazard that falls with depth; each switched off restores the old behaviour."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import pytest

from cfg_helpers import compose_cfg
from contract import assert_same_tree
from specscale.cell import build_server
from specscale.engine.synthetic.workload import N_SPECIAL, SyntheticWorkload, WorkloadParams
from specscale.hashing import combine
from specscale.metrics.summary import summarize

OFF = WorkloadParams(identical_step_rate=0.0, sibling_error_correlation=0.0, error_round_decay=1.0)


@dataclass
class Cand:  # the fields the workload reads of a candidate
    end_hash: int
    round: int
    request_id: int = 0
    parent: Optional["Cand"] = None


def _sample_step(w: SyntheticWorkload, start: int, key: int) -> list[int]:
    """One step drawn token by token from history `start` (uniforms from `key`)."""
    from specscale.hashing import roll, to_unit

    h, toks = start, []
    for pos in range(200):
        p = w.probabilities(np.array([h], dtype=np.uint64), np.array([pos]), np.array([2]),
                            np.array([start], dtype=np.uint64))[0]
        t = int(np.searchsorted(np.cumsum(p), to_unit(combine(key, pos)) * p.sum(), side="right"))
        toks.append(t)
        if t < 2:
            break
        h = roll(h, t)
    return toks


def test_determined_steps_are_written_identically_by_every_sibling():
    w = SyntheticWorkload(replace(OFF, identical_step_rate=0.5), 0.8)
    same = 0
    for g in range(200):
        start = combine(0xABC, g)
        steps = [_sample_step(w, start, combine(start, j)) for j in range(4)]
        same += all(s == steps[0] for s in steps)
    assert 70 < same < 130  # about half the groups: the determined ones
    off = SyntheticWorkload(OFF, 0.8)
    assert sum(len({tuple(_sample_step(off, combine(0xABC, g), combine(g, j))) for j in range(4)}) == 1
               for g in range(100)) < 10


def _sibling_losses(params: WorkloadParams, rounds: int = 1, n: int = 4000) -> np.ndarray:
    """[parents, siblings] of lost flags for children of independent parents at a round."""
    w = SyntheticWorkload(params, 0.8)
    out = np.zeros((n, 4), dtype=bool)
    for i in range(n):
        parent = Cand(combine(0x77, i), rounds - 1)
        for j in range(4):
            out[i, j] = w._lost(Cand(combine(parent.end_hash, j + 1), rounds, parent=parent), 0.4)
    return out


def test_sibling_errors_correlate_through_the_parent_with_the_stated_strength():
    rho = 0.7
    lost = _sibling_losses(replace(OFF, sibling_error_correlation=rho))
    p = lost.mean()
    both = (lost[:, 0] & lost[:, 1]).mean() / lost[:, 0].mean()
    assert p == pytest.approx(0.5 * 0.4, abs=0.02)  # the marginal hazard is unchanged
    assert both == pytest.approx(rho ** 2 + (1 - rho ** 2) * p, abs=0.05)
    free = _sibling_losses(OFF)
    assert (free[:, 0] & free[:, 1]).mean() / free[:, 0].mean() == pytest.approx(free.mean(), abs=0.04)


def test_the_hazard_falls_with_depth_and_keeps_its_mean():
    p = replace(OFF, error_round_decay=0.6)
    n = round(p.steps_median)
    factors = [p.round_factor(r) for r in range(n)]
    assert factors == sorted(factors, reverse=True) and np.mean(factors) == pytest.approx(1.0)
    early, late = _sibling_losses(p, rounds=0).mean(), _sibling_losses(p, rounds=4).mean()
    assert early > 2 * late
    assert OFF.round_factor(5) == 1.0


def test_determined_steps_let_deduplication_save_prm_work_and_keep_the_tree():
    def run(policy, q):
        rec = build_server(compose_cfg(f"policy={policy}", "beam=8", "seed=3",
                                       f"engine.synthetic.identical_step_rate={q}")).run()
        return rec, summarize(rec, [60], 1)

    ns, ns_s = run("nonspec", 0.3)
    cd, cd_s = run("nonspec_cd", 0.3)
    assert_same_tree(cd, ns, "nonspec_cd with determined steps")
    assert cd_s["prm_tokens"] < 0.95 * ns_s["prm_tokens"]
    ep, _ = run("ep_strict", 0.3)
    assert_same_tree(ep, ns, "ep_strict with determined steps")


def test_determined_steps_err_at_their_factor_and_the_others_at_the_rounds_hazard():
    p = replace(OFF, identical_step_rate=0.3, determined_hazard_factor=0.2)
    w = SyntheticWorkload(p, 0.8)
    det, other = [], []
    for i in range(6000):
        parent = Cand(combine(0x99, i), 1)
        c = Cand(combine(parent.end_hash, 1), 2, parent=parent)
        (det if w.is_determined(parent.end_hash, 2) else other).append(w._lost(c, 0.4))
    hazard = 0.5 * 0.4
    assert len(det) / 6000 == pytest.approx(0.3, abs=0.03)
    assert np.mean(det) == pytest.approx(0.2 * hazard, abs=0.02)
    assert np.mean(other) == pytest.approx(hazard, abs=0.02)


def test_later_rounds_are_more_often_determined():
    p = replace(OFF, identical_step_rate=0.5, undetermined_round_decay=0.6)
    assert p.determined_share(0) == pytest.approx(0.5) and p.determined_share(2) == pytest.approx(1 - 0.5 * 0.36)
    w = SyntheticWorkload(p, 0.8)
    starts = [combine(0x3A, i) for i in range(4000)]
    shares = [np.mean([w.is_determined(s, r) for s in starts]) for r in (0, 2)]
    assert shares[0] == pytest.approx(0.5, abs=0.03) and shares[1] == pytest.approx(0.82, abs=0.03)
    assert OFF.determined_share(3) == 0.0 and replace(OFF, identical_step_rate=0.2).determined_share(7) == 0.2


def test_a_problems_determined_share_is_shifted_by_its_own_draw():
    p = replace(OFF, identical_step_rate=0.4, undetermined_round_decay=0.7, determined_problem_spread=1.5)
    assert p.per_problem_text and not replace(p, determined_problem_spread=0.0).per_problem_text
    w = SyntheticWorkload(p, 0.8)
    z = np.array([w.problem_z(k) for k in range(4000)])
    assert abs(z.mean()) < 0.06 and z.std() == pytest.approx(1.0, abs=0.05)  # a standard normal per problem
    assert w.problem_z(17) == w.problem_z(17)
    # logit(share) moves by spread x z; z = 0 and z = None give the round's share.
    base = float(p.determined_share(2))
    assert float(p.determined_share(2, 0.0)) == pytest.approx(base)
    assert float(p.determined_share(2, 1.0)) == pytest.approx(1 / (1 + (1 - base) / base * np.exp(-1.5)))
    starts = [combine(0x3B, i) for i in range(4000)]
    for zz in (-1.0, 1.0):
        share = np.mean([w.is_determined(s, 2, zz) for s in starts])
        assert share == pytest.approx(float(p.determined_share(2, zz)), abs=0.03)
    # The token law needs the problem once the share depends on it.
    with pytest.raises(ValueError, match="problem"):
        w.probabilities(np.array([5], dtype=np.uint64), np.array([0]), np.array([1]), np.array([9], dtype=np.uint64))


def test_a_problems_solution_length_is_its_own():
    """steps_problem_sigma: each problem draws its median steps; its paths' EOS hazard is
    the steps law around that median (the table's law when the spread is 0)."""
    p = replace(OFF, steps_median=4.0, steps_sigma=0.05, steps_problem_sigma=0.4)
    w = SyntheticWorkload(p, 0.8)
    keys = np.arange(1, 400, dtype=np.uint64)
    n = np.arange(12)

    def expected_steps(key):
        h = w._eos_hazard(n, np.full(len(n), key, dtype=np.uint64))
        alive = np.concatenate([[1.0], np.cumprod(1.0 - h)[:-1]])
        return float(((n + 1) * alive * h).sum())

    means = np.array([expected_steps(k) for k in keys])
    assert means.std() > 1.0  # problems differ in length
    assert np.median(means) == pytest.approx(4.5, abs=0.5)  # L = ceil(X), X of median 4
    # One problem's paths: a narrow law (steps_sigma 0.05) -> its mass on three adjacent counts
    # at most (whatever the median, against the 6+ the problems span).
    for key in (7, 8, 9):
        h = w._eos_hazard(n, np.full(len(n), key, dtype=np.uint64))
        mass = np.concatenate([[1.0], np.cumprod(1.0 - h)[:-1]]) * h
        assert np.sort(mass)[-3:].sum() > 0.99
    # Without the spread the per-row hazard is the shared table's, bit for bit.
    flat = SyntheticWorkload(replace(p, steps_problem_sigma=0.0), 0.8)
    assert np.array_equal(flat._eos_hazard(n, None), flat._eos[n])
    # And the fixed-median formula agrees with the table where both apply (z = 0 key search).
    k0 = next(k for k in range(1, 100000) if abs(w.problem_z(k, 0x57E)) < 1e-3)
    table = SyntheticWorkload(replace(p, steps_problem_sigma=0.0), 0.8)._eos[n]
    assert np.allclose(w._eos_hazard(n, np.full(len(n), k0, dtype=np.uint64)), table, atol=0.02)


def test_steps_of_a_round_can_share_their_rounds_scores():
    """round_score_share: that share of steps take their problem round's reward: every
    on-track one the round's right score, off-track ones one of its wrong scores, as often
    equal as wrong_score_overlap says; 0 scores every step from its own history."""
    base = replace(OFF, prm_step_sensitivity=0.5, exact_one_share=0.0)

    def scores(w):
        on, off = [], []
        for j in range(400):
            c = Cand(combine(0x77, j), 0)
            (on if w.on_track([c], 0.6, 5) else off).append(w.step_rewards([c], 0.6, 5)[0])
        assert len(on) > 50 and len(off) > 50
        return on, off

    on, off = scores(SyntheticWorkload(base, 0.8))
    assert len(set(on)) == len(on) and len(set(off)) == len(off)
    for overlap in (0.2, 0.8):
        on, off = scores(SyntheticWorkload(replace(base, round_score_share=1.0, wrong_score_overlap=overlap), 0.8))
        assert len(set(on)) == 1 and not set(on) & set(off)
        values, counts = np.unique(off, return_counts=True)
        assert (counts * (counts - 1)).sum() / (len(off) * (len(off) - 1)) == pytest.approx(overlap, abs=0.1)
    # Another problem, or another round of it: another shared value (difficulty 0: on track).
    shared = SyntheticWorkload(replace(base, round_score_share=1.0), 0.8)
    a, b, c = Cand(combine(0x78, 1), 0), Cand(combine(0x78, 2), 0), Cand(combine(0x78, 3), 1)
    r_a, r_b = shared.step_rewards([a], 0.0, 5)[0], shared.step_rewards([b], 0.0, 6)[0]
    assert r_a != r_b and shared.step_rewards([a, c], 0.0, 5)[1] != r_a


def test_siblings_follow_the_position_profile_and_can_end_together():
    """token_overlap_by_position sets the overlap at each position of a step (then
    token_overlap); sibling_length_share 1 makes every sibling of one start end at its
    length; without them the head and body laws are the same as before."""
    profile = (0.99, 0.6, 0.99)
    p = replace(OFF, token_overlap=0.9, token_overlap_by_position=profile, step_len_median=6.0,
                step_len_sigma=0.4, sibling_length_share=1.0)  # fmt: skip
    w = SyntheticWorkload(p, 1.0)
    assert p.position_overlaps() == [*profile, 0.9]
    probs = w.probabilities(np.arange(1, 6, dtype=np.uint64), np.arange(5), np.ones(5, dtype=np.int64),
                            np.full(5, 77, dtype=np.uint64))  # fmt: skip
    content = probs[:, N_SPECIAL:] / probs[:, N_SPECIAL:].sum(axis=1, keepdims=True)
    assert (content ** 2).sum(axis=1)[:4] == pytest.approx([*profile, 0.9], abs=1e-6)
    # Every sibling of one step start: the same length, the start's.
    for start in (combine(0x91, i) for i in range(20)):
        lengths = {len(_sample_step(w, start, combine(start, k))) for k in range(4)}
        assert lengths == {int(w.determined_length(np.array([start], dtype=np.uint64))[0])}
    # A step start must travel with the rows once lengths are shared.
    with pytest.raises(ValueError, match="began"):
        w.probabilities(np.arange(1, 3, dtype=np.uint64), np.arange(2), np.ones(2, dtype=np.int64))
    plain = replace(OFF, head_overlap=0.97, token_overlap=0.9)
    assert plain.position_overlaps() == [0.97] * plain.head_tokens + [0.9]


def _problem_losses(params: WorkloadParams, n_problems: int = 1500, parents: int = 4) -> np.ndarray:
    """[problems, parents] of lost flags: one child of each of `parents` distinct parents
    of a problem at round 1 (different histories, so only the problem links them)."""
    w = SyntheticWorkload(params, 0.8)
    out = np.zeros((n_problems, parents), dtype=bool)
    for i in range(n_problems):
        key = combine(0x51, i)
        for j in range(parents):
            parent = Cand(combine(key, 100 + j), 0)
            out[i, j] = w._lost(Cand(combine(parent.end_hash, 1), 1, parent=parent), 0.6, key)
    return out


def test_a_hard_step_is_hard_for_every_path_of_the_problem():
    sigma = 0.6
    lost = _problem_losses(replace(OFF, problem_step_correlation=sigma))
    p = lost.mean()
    assert p == pytest.approx(0.5 * 0.6, abs=0.02)  # the marginal hazard is unchanged
    both = (lost[:, 0] & lost[:, 1]).mean() / lost[:, 0].mean()
    assert both == pytest.approx(sigma ** 2 + (1 - sigma ** 2) * p, abs=0.05)
    assert lost.all(axis=1).mean() > 3 * p ** 4  # a wider search cannot route around it
    free = _problem_losses(OFF)
    assert (free[:, 0] & free[:, 1]).mean() / free[:, 0].mean() == pytest.approx(free.mean(), abs=0.04)


def test_off_track_paths_reach_the_reference_at_the_stated_share():
    @dataclass
    class Done(Cand):
        end_reason: str = "eos"

    def answers(share: float) -> list[str]:
        w = SyntheticWorkload(replace(OFF, error_rate=1.0, off_track_correct_share=share), 0.8)
        out = []
        for i in range(3000):
            c = Done(combine(0xA1, i), 0)
            if not w.on_track([c], 1.0):  # hazard 1 x difficulty 1: every path is off track
                out.append(w.answer([c], 1.0, 7, "ref"))
        return out

    some = answers(0.2)
    assert len(some) == 3000 and np.mean([a == "ref" for a in some]) == pytest.approx(0.2, abs=0.025)
    assert not any(a == "ref" for a in answers(0.0))



def test_a_less_sensitive_prm_scores_a_step_by_its_round():
    """prm_step_sensitivity s: the PRM sees an on-track step as on track with probability
    s in a round where the problem's hard step fails, always where it holds; s = 1 scores
    every step by its own state."""
    lam = 0.4
    w = SyntheticWorkload(replace(OFF, prm_step_sensitivity=lam), 0.8)
    keys = [combine(0x61, i) for i in range(400)]
    hard = [k for k in keys if w._problem_draw(Cand(0, 0), k) < 0.5]  # error_rate 0.5 x difficulty 1
    easy = [k for k in keys if k not in hard]

    def seen_on(problem_keys) -> float:
        seen = []
        for k in problem_keys:
            for j in range(20):
                c = Cand(combine(k, j), 0)
                if w.on_track([c], 1.0, k):
                    seen.append(w._seen_on_track([c], 1.0, k, c.end_hash))
        return float(np.mean(seen))

    assert seen_on(hard) == pytest.approx(lam, abs=0.05)
    assert seen_on(easy) == 1.0
    full = SyntheticWorkload(OFF, 0.8)
    c = Cand(combine(hard[0], 1), 0)
    assert full._seen_on_track([c], 1.0, hard[0], c.end_hash) == full.on_track([c], 1.0, hard[0])
