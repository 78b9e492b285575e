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
from specscale.engine.synthetic.workload import SyntheticWorkload, WorkloadParams
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


def test_determined_steps_carry_their_share_of_the_hazard_and_the_mean_stays():
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
    assert np.mean(other) == pytest.approx((1 - 0.3 * 0.2) / 0.7 * hazard, abs=0.02)
    assert np.mean(det + other) == pytest.approx(hazard, abs=0.02)


def test_later_rounds_are_more_often_determined():
    p = replace(OFF, identical_step_rate=0.5, undetermined_round_decay=0.6)
    assert p.determined_share(0) == pytest.approx(0.5) and p.determined_share(2) == pytest.approx(1 - 0.5 * 0.36)
    w = SyntheticWorkload(p, 0.8)
    starts = [combine(0x3A, i) for i in range(4000)]
    shares = [np.mean([w.is_determined(s, r) for s in starts]) for r in (0, 2)]
    assert shares[0] == pytest.approx(0.5, abs=0.03) and shares[1] == pytest.approx(0.82, abs=0.03)
    assert OFF.determined_share(3) == 0.0 and replace(OFF, identical_step_rate=0.2).determined_share(7) == 0.2


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
                    seen.append(w._seen_on_track([c], 1.0, k))
        return float(np.mean(seen))

    assert seen_on(hard) == pytest.approx(lam, abs=0.05)
    assert seen_on(easy) == 1.0
    full = SyntheticWorkload(OFF, 0.8)
    c = Cand(combine(hard[0], 1), 0)
    assert full._seen_on_track([c], 1.0, hard[0]) == full.on_track([c], 1.0, hard[0])
