"""The fitter recovers the sim's workload mechanisms (identical_step_rate,
undetermined_round_decay, determined_hazard_factor, sibling_error_correlation,
error_round_decay) from traces the
sim itself generates with known values, and finds none of them when they are switched off.

Traces: a sim server (engine=sim, policy=nonspec, beam 8) runs; every finished request
keeps its search's rounds, whose members are the search's Candidate objects (key,
parent, step tokens, end hash). Their latent labels come from the workload that drew
them: ``workload.on_track(candidate.path(), difficulty)`` (memoised by end hash during
the run, when the PRM scored them), so the frame holds what ``traces.member_frame``
builds from a testbed run, with the sim's true labels in place of the checker's. The
workload constants are all set here (not read from conf/synthetic/testbed.yaml, which a
refit rewrites), with error_rate = 1 as the fitter reads it and no exact-1.0 scores (no
round closes before every member is scored). The sim is deterministic for a seed, and
the margins below hold across seeds 0-5 at this size (rho within 0.05, decay within
0.04, q within 0.01 of the truth; rho <= 0.07 and decay >= 0.95 switched off; f_d 0.2
read as 0.23-0.27 and 1 as 1.06-1.13: the problems, and so the round-0 draws, are the
same for every seed, so the seeds share one realisation of the determined groups'
losses, which ran above their expectation). Every mechanism, determined_hazard_factor
included, is set explicitly: the engine's default may change.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specscale.engine.synthetic.workload import WorkloadParams
from specscale.calibration import workload_fit as F
from specscale.calibration.sim_traces import sim_member_frame

SHAPE = {"token_overlap": 0.95, "head_overlap": 0.99, "step_len_median": 8, "step_len_sigma": 0.2,
         "steps_median": 4, "steps_sigma": 0.25}  # fmt: skip
DIFFICULTY = (0.3, 2.0)  # mean, concentration
N_PROBLEMS = 500


def sim_traces(n: int, seed: int = 0, beam: int = 8, **mechanisms):
    """(member frame, prompt lengths, reference answers, the problems' mean difficulty)."""
    from specscale.cell import build_server
    from specscale.compose import compose_config

    overrides = ["engine=sim", "policy=nonspec", f"beam={beam}", f"expansion={min(4, beam)}", f"n_problems={n}",
                 f"seed={seed}", "progress=false", "wandb.mode=disabled", "engine.synthetic.error_rate=1",
                 "engine.synthetic.exact_one_share=0", f"dataset.sim.difficulty_mean={DIFFICULTY[0]}",
                 f"engine.problems.difficulty_concentration={DIFFICULTY[1]}"]  # fmt: skip
    off = {"problem_step_correlation": 0.0, "off_track_correct_share": 0.0, "prm_step_sensitivity": 1.0}
    overrides += [f"engine.synthetic.{k}={v}" for k, v in {**SHAPE, **off, **mechanisms}.items()]
    server = build_server(compose_config(overrides))
    server.run()
    problems = server.backend.problems
    df = sim_member_frame(server)
    answers = {p.id: p.answer for p in problems.values()}
    return df, [p.prompt_tokens for p in problems.values()], answers, float(np.mean([p.difficulty for p in
                                                                                    problems.values()]))


def _fit_known(determined_hazard_factor: float):
    """The fit of sim traces with q 0.3, rho 0.6, decay 0.7 and the given factor: the
    fitted workload and the true mean difficulty; q, rho and decay are checked here."""
    members, prompts, answers, d_mean = sim_traces(N_PROBLEMS, identical_step_rate=0.3, undetermined_round_decay=1.0,
                                                   determined_hazard_factor=determined_hazard_factor,
                                                   sibling_error_correlation=0.6, error_round_decay=0.7)  # fmt: skip
    fitted = F.fit(members, prompts, answers)
    syn = fitted.synthetic
    assert syn["identical_step_rate"] == pytest.approx(0.3, abs=0.1)
    assert syn["undetermined_round_decay"] > 0.85  # the same share in every round
    assert syn["sibling_error_correlation"] == pytest.approx(0.6, abs=0.15)
    assert syn["error_round_decay"] == pytest.approx(0.7, abs=0.1)
    assert fitted.dataset_sim["difficulty_mean"] == pytest.approx(d_mean, abs=0.04)
    return fitted


def test_fit_recovers_the_mechanisms_from_sim_traces():
    fitted = _fit_known(1.0)
    syn, checks = fitted.synthetic, fitted.checks
    # Determined steps err as often as any: no factor is read into them.
    assert syn["determined_hazard_factor"] == pytest.approx(1.0, abs=0.2)
    # The overlaps are read off the steps the sim does not determine.
    assert syn["token_overlap"] == pytest.approx(SHAPE["token_overlap"], abs=0.01)
    assert syn["head_overlap"] == pytest.approx(SHAPE["head_overlap"], abs=0.005)
    assert checks["overlap_all_groups"]["token_overlap"] > SHAPE["token_overlap"] + 0.01
    assert 1.0 < fitted.problems["difficulty_concentration"] < 4.0
    # The pooled statistics miss: P(lost | a sibling lost) counts identical siblings and
    # the spread of difficulty, and later rounds are reached by easier problems.
    assert checks["sibling_error_correlation_pooled"] > 0.7
    assert checks["error_round_decay_pooled"] < 0.65
    assert checks["identical_share_observed"] == pytest.approx(0.3, abs=0.05)


def test_fit_recovers_a_determined_steps_share_of_the_hazard():
    fitted = _fit_known(0.2)  # the other mechanisms are still told apart from it
    syn, checks = fitted.synthetic, fitted.checks
    assert syn["determined_hazard_factor"] == pytest.approx(0.2, abs=0.1)
    # The raw loss rates show it: determined groups lose a fraction of what the others do.
    loss = checks["loss_by_determined"]
    assert loss["determined"]["loss_rate"] < 0.4 * loss["other"]["loss_rate"]
    f_det, f_other = checks["determined_hazard_factors"]["determined"], checks["determined_hazard_factors"]["other"]
    assert f_det == syn["determined_hazard_factor"]
    assert f_other == 1.0  # the other steps keep the round's hazard
    WorkloadParams.from_config(syn)  # a valid setting


def test_fit_recovers_a_determined_share_growing_with_the_round():
    members, prompts, answers, d_mean = sim_traces(N_PROBLEMS // 2, identical_step_rate=0.3,
                                                   undetermined_round_decay=0.6, determined_hazard_factor=0.5,
                                                   sibling_error_correlation=0.6, error_round_decay=0.7)  # fmt: skip
    groups = F.sibling_groups(members)
    ident = F.identical_step_fit(groups, WorkloadParams(**SHAPE))
    assert ident["q"] == pytest.approx(0.3, abs=0.1)
    assert ident["u"] == pytest.approx(0.6, abs=0.15)
    shares = [ident["by_round"][r]["observed"] for r in sorted(ident["by_round"]) if ident["by_round"][r]["groups"]
              >= 50]  # fmt: skip
    assert shares == sorted(shares) and shares[-1] > shares[0] + 0.2  # the traces' share grows
    for row in ident["by_round"].values():
        if row["groups"] >= 100:
            assert row["fitted"] == pytest.approx(row["observed"], abs=0.08)
    law = F.error_law_fit(groups, SHAPE["steps_median"], lambda m, r: F.simulated_patterns(
        WorkloadParams(**SHAPE), m, r), determined=ident["q"], determined_decay=ident["u"])  # fmt: skip
    assert law["determined_hazard_factor"] == pytest.approx(0.5, abs=0.2)
    assert law["sibling_error_correlation"] == pytest.approx(0.6, abs=0.15)
    assert law["error_round_decay"] == pytest.approx(0.7, abs=0.1)


def test_identical_step_fit_recovers_q_and_u_from_counts():
    rng = np.random.default_rng(0)
    rows = []
    for r in range(5):
        q_r = 1 - 0.7 * 0.6 ** r
        for ident in rng.random(400) < q_r:
            rows.append({"round": r, "m": 4, "identical": bool(ident), "n_tokens": 8})
    ident = F.identical_step_fit(pd.DataFrame(rows), WorkloadParams(**SHAPE))
    assert ident["q"] == pytest.approx(0.3, abs=0.06) and ident["u"] == pytest.approx(0.6, abs=0.08)
    assert ident["spread"] == 0.0  # no problem ids: no spread between problems can be read


def test_steps_problem_fit_recovers_both_spreads():
    rng = np.random.default_rng(2)
    ids, steps = [], []
    for pid in range(150):
        med = 4.0 * np.exp(0.3 * rng.standard_normal())
        for x in med * np.exp(0.1 * rng.standard_normal(12)):
            ids.append(f"p{pid}")
            steps.append(max(1, int(np.ceil(x))))
    fit = F.steps_problem_fit(ids, steps)
    assert fit["problem_sigma"] == pytest.approx(0.3, abs=0.06)
    assert fit["sigma"] == pytest.approx(0.1, abs=0.04)
    assert fit["median"] == pytest.approx(4.0, rel=0.1)
    assert fit["nll"] < fit["nll_pooled"] - 50
    # One path per problem: the spreads cannot be told apart, but their sum is the pooled law's.
    single = F.steps_problem_fit(range(600), [max(1, int(np.ceil(4 * np.exp(0.3 * z))))
                                              for z in rng.standard_normal(600)])  # fmt: skip
    assert np.hypot(single["sigma"], single["problem_sigma"]) == pytest.approx(0.3, abs=0.06)


def test_the_fit_writes_the_text_mechanisms_when_asked():
    members, prompts, answers, _ = sim_traces(60, token_overlap_by_position=[0.99, 0.99, 0.7], sibling_length_share=0.8)
    syn = F.fit(members, prompts, answers, text_mechanisms=True).synthetic
    assert syn["token_overlap_by_position"][:3] == pytest.approx([0.99, 0.99, 0.7], abs=0.06)
    assert syn["sibling_length_share"] == pytest.approx(0.8, abs=0.15)
    WorkloadParams.from_config(syn)  # a valid setting


def test_identical_step_fit_recovers_a_spread_across_problems():
    from scipy.special import expit, logit

    rng = np.random.default_rng(1)
    rows = []
    for pid in range(300):
        z = rng.standard_normal()
        for r in range(4):
            q_r = expit(logit(1 - 0.7 * 0.6 ** r) + 1.2 * z)
            for ident in rng.random(3) < q_r:
                rows.append({"problem_id": f"p{pid}", "round": r, "m": 4, "identical": bool(ident), "n_tokens": 8})
    groups = pd.DataFrame(rows)
    ident = F.identical_step_fit(groups, WorkloadParams(**SHAPE))
    assert ident["spread"] == pytest.approx(1.2, abs=0.3)
    assert ident["q"] == pytest.approx(0.3, abs=0.08) and ident["u"] == pytest.approx(0.6, abs=0.1)
    flat = F.identical_step_fit(groups, WorkloadParams(**SHAPE), problem_spread=False)
    assert flat["spread"] == 0.0 and flat["nll"] > ident["nll"] + 10


def test_switching_the_mechanisms_off_restores_independence():
    members, prompts, answers, d_mean = sim_traces(N_PROBLEMS, identical_step_rate=0.0, undetermined_round_decay=1.0,
                                                   determined_hazard_factor=1.0, sibling_error_correlation=0.0,
                                                   error_round_decay=1.0)  # fmt: skip
    fitted = F.fit(members, prompts, answers)
    syn, checks = fitted.synthetic, fitted.checks
    assert syn["sibling_error_correlation"] < 0.15
    assert syn["error_round_decay"] > 0.85
    assert syn["identical_step_rate"] < 0.02
    # The text mechanisms are measured but not written by default.
    assert "token_overlap_by_position" not in syn and "sibling_length_share" not in syn
    assert len(checks["token_overlap_by_position"]) >= 3 and checks["sibling_lengths"]["groups"] > 0
    # With (almost) no determined steps their factor is unidentified, but it leaves the
    # other steps' hazard alone.
    assert syn["identical_step_rate"] * abs(syn["determined_hazard_factor"] - 1.0) < 0.02
    assert checks["identical_share_observed"] < 0.01  # chance alone: siblings rarely stop together
    assert fitted.dataset_sim["difficulty_mean"] == pytest.approx(d_mean, abs=0.04)
    # Independent losses, and still the pooled pair statistic reads a large correlation.
    assert checks["sibling_error_correlation_pooled"] > 0.35


def test_chance_identical_is_what_the_sim_draws():
    params = WorkloadParams(token_overlap=0.9, head_overlap=0.97, step_len_median=5.0, step_len_sigma=0.3,
                            steps_median=4.0, steps_sigma=0.3)  # fmt: skip
    for m, r in ((2, 0), (4, 3)):
        chance = F.chance_identical(params, m, r)
        law = F.simulated_patterns(params, m, r, n=20000, seed=1)
        se = math.sqrt(chance * (1 - chance) / 20000)
        assert law.get((m,), 0.0) == pytest.approx(chance, abs=4 * se + 1e-4)
        assert sum(law.values()) == pytest.approx(1.0)
    determined = WorkloadParams(**{**params.__dict__, "identical_step_rate": 0.3})
    assert F.simulated_patterns(determined, 2, 0, n=20000, seed=1)[(2,)] == pytest.approx(
        0.3 + 0.7 * F.chance_identical(params, 2, 0), abs=0.01)
    # The overlap-power approximation ignores that siblings stop independently.
    assert F.chance_identical(params, 2, 0) < 0.5 * 0.97 ** 3 * 0.9 ** 2


def test_chance_identical_with_a_position_profile_and_shared_lengths_is_what_the_sim_draws():
    params = WorkloadParams(token_overlap=0.9, token_overlap_by_position=(0.99, 0.95, 0.7), step_len_median=4.0,
                            step_len_sigma=0.3, steps_median=4.0, steps_sigma=0.3, sibling_length_share=0.6)  # fmt: skip
    for m, r in ((2, 0), (3, 2)):
        chance = F.chance_identical(params, m, r)
        law = F.simulated_patterns(params, m, r, n=20000, seed=2)
        se = math.sqrt(chance * (1 - chance) / 20000)
        assert law.get((m,), 0.0) == pytest.approx(chance, abs=4 * se + 1e-4)
    # Shared lengths make whole identical steps likelier than lengths drawn apart.
    apart = WorkloadParams(**{**params.__dict__, "sibling_length_share": 0.0})
    assert F.chance_identical(params, 2, 0) > 1.5 * F.chance_identical(apart, 2, 0)


def test_the_fit_reads_a_position_profile_and_shared_lengths_from_sim_traces():
    profile = (0.99, 0.97, 0.99, 0.8, 0.6)
    members, *_ = sim_traces(N_PROBLEMS // 2, identical_step_rate=0.0, token_overlap_by_position=list(profile),
                             sibling_length_share=0.6)  # fmt: skip
    counts = F.collision_counts(members.assign(_h=F.history_groups(members)), group="_h")
    fitted = F.position_collision(counts)
    assert len(fitted) >= 5
    assert fitted[:5] == pytest.approx([min(v, F.MAX_OVERLAP) for v in profile], abs=0.03)
    assert fitted[6:] == pytest.approx([SHAPE["token_overlap"]] * len(fitted[6:]), abs=0.05)
    params = WorkloadParams.from_config({**SHAPE, "token_overlap_by_position": list(profile)})
    assert F.sibling_length_fit(counts, params)["share"] == pytest.approx(0.6, abs=0.08)


def test_block_law_counts_lost_children_by_identical_step():
    law = F._block_law({(2, 1): 1.0}, 3)  # two identical siblings and one apart: two distinct steps
    p = 0.3
    j = np.arange(3)
    prob = law[2] @ (p ** j * (1 - p) ** (2 - j))
    assert prob.tolist() == pytest.approx([(1 - p) ** 2, p * (1 - p), p * (1 - p), p * p])


def test_history_groups_join_parents_that_wrote_the_same_text():
    members = pd.DataFrame({
        "request_id": [0] * 6, "round": [0, 0, 1, 1, 1, 1], "key": [1, 2, 3, 4, 5, 6],
        "parent": pd.Series([None, None, 1, 1, 2, 2], dtype=object),
        "tokens": [[7, 8], [7, 8], [9], [9], [9], [5]],
        "on_track": [True, True, True, True, True, False], "parent_on_track": [True] * 6})  # fmt: skip
    hist = F.history_groups(members)
    assert hist.iloc[2] == hist.iloc[4] != hist.iloc[0]
    groups = F.sibling_groups(members)
    assert sorted(groups["m"]) == [2, 4] and groups.set_index("m").loc[4, "blocks"] == (3, 1)
    assert groups.set_index("m").loc[4, "lost"] == 1 and bool(groups.set_index("m").loc[2, "identical"])


def test_pooled_decay_fit_recovers_a_geometric_hazard():
    tried = np.array([4000, 3000, 2000, 1000])
    lost = np.round(tried * 0.3 * 0.6 ** np.arange(4))
    assert F.pooled_decay_fit(lost, tried) == pytest.approx(0.6, abs=0.01)


def test_determined_factors_are_the_sims():
    from specscale.engine.synthetic.workload import SyntheticWorkload

    for q, f_d in ((0.3, 0.2), (0.66, 1.4), (0.3, 1.0), (0.0, 0.5)):
        w = SyntheticWorkload(WorkloadParams(identical_step_rate=q, determined_hazard_factor=f_d), 1.0)
        starts = range(2000)
        det = next(s for s in starts if w.is_determined(s, 0)) if q else None
        other = next(s for s in starts if not w.is_determined(s, 0))
        f_det, f_other = F.determined_factors(q, f_d)
        assert f_other == pytest.approx(w._determined_factor(other, 0))
        if det is not None:
            assert f_det == pytest.approx(w._determined_factor(det, 0))
    # A share that grows with the round: the factors at q_r, as the sim's.
    params = WorkloadParams(identical_step_rate=0.3, undetermined_round_decay=0.6, determined_hazard_factor=0.5)
    w = SyntheticWorkload(params, 1.0)
    for r in range(5):
        q_r = float(params.determined_share(r))
        assert F.determined_shares([r], 0.3, 0.6)[0] == pytest.approx(q_r)
        f_det, f_other = F.determined_factors(q_r, 0.5)
        det = next(s for s in range(2000) if w.is_determined(s, r))
        other = next(s for s in range(2000) if not w.is_determined(s, r))
        assert (f_det, f_other) == pytest.approx((w._determined_factor(det, r), w._determined_factor(other, r)))


def test_round_factors_are_the_sims():
    for decay in (0.5, 0.7, 1.0):
        params = WorkloadParams(steps_median=3.4, error_round_decay=decay)
        assert F.round_factors(range(6), decay, 3.4).tolist() == pytest.approx([params.round_factor(r)
                                                                                 for r in range(6)])


def repeated_sim_traces(n: int, searches: int = 3, **mechanisms):
    """``sim_traces`` of seeds 0..searches-1 in one frame, request ids (and sibling groups)
    made distinct per search: several independent searches of the same problems, as
    ``runners.fit_testbed_workload --fit-searches`` collects them from the testbed."""
    frames, prompts, answers, d_mean = [], None, None, None
    for k in range(searches):
        members, prompts, answers, d_mean = sim_traces(n, seed=k, **mechanisms)
        members = members.assign(request_id=members["request_id"] + k * 1_000_000)
        members["group"] = [(rid, parent) for rid, parent in zip(members["request_id"], members["parent"])]
        frames.append(members)
    return pd.concat(frames, ignore_index=True), prompts, answers, d_mean


@pytest.mark.parametrize("sigma", [0.5, 0.0])
def test_fit_tells_a_problems_hard_step_from_difficulty_and_the_parent(sigma):
    """Three searches of each problem: a (problem, round) that fails in every search is
    read as the problem's step (sigma), not as a spread of difficulty or as siblings
    failing together; switched off it reads (almost) nothing."""
    members, prompts, answers, d_mean = repeated_sim_traces(N_PROBLEMS // 2, identical_step_rate=0.3,
                                                            undetermined_round_decay=1.0, determined_hazard_factor=1.0,
                                                            sibling_error_correlation=0.6, error_round_decay=0.7,
                                                            problem_step_correlation=sigma)  # fmt: skip
    groups = F.sibling_groups(members)
    law = F.error_law_fit(groups, SHAPE["steps_median"], lambda m, r: F.simulated_patterns(
        WorkloadParams(**SHAPE), m, r), determined=0.3)  # fmt: skip
    # (read as 0.49 and 0.05, rho as 0.59 for both, at this size and seeds 0-2)
    assert law["problem_step_correlation"] == pytest.approx(sigma, abs=0.1)
    assert law["sibling_error_correlation"] == pytest.approx(0.6, abs=0.15)
    assert law["error_round_decay"] == pytest.approx(0.7, abs=0.1)
    assert 1.0 < law["difficulty_concentration"] < 4.0  # the true spread (2.0), not inflated by sigma


def test_score_equality_and_the_shared_share():
    rows = []
    for pid in range(3):
        for rd in range(2):
            rows += [{"problem_id": pid, "round": rd, "on_track": True, "score": 0.5 + pid / 10} for _ in range(3)]
            rows += [{"problem_id": pid, "round": rd, "on_track": True, "score": 0.11 + pid / 10 + rd / 100}]
            rows += [{"problem_id": pid, "round": rd, "on_track": False, "score": 0.5 + k / 10} for k in range(4)]
    frame = pd.DataFrame(rows)
    assert F.score_equality(frame) == pytest.approx(3 / 6)  # of each round's 6 on-track pairs, 3 are equal
    assert F.score_equality(frame, on_track=False) == 0.0
    # e = psi^2 + (1 - psi^2) e0, inverted; e at or below the chance equality reads 0, e = 1 reads 1.
    assert F.shared_score_share(0.25 + 0.75 * 0.2, 0.2) == pytest.approx(0.5)
    assert F.shared_score_share(0.1, 0.2) == 0.0 and F.shared_score_share(1.0, 0.6) == 1.0
    assert F.shared_score_share(0.9, 1.0) == 0.0
    # Off track: e = psi^2 w + (1 - psi^2) e0.
    assert F.wrong_score_overlap(0.25 * 0.6 + 0.75 * 0.3, 0.3, 0.5) == pytest.approx(0.6)
    assert F.wrong_score_overlap(0.9, 0.3, 0.0) == 0.5  # unused without shared scores


def test_the_sims_score_equality_reads_back_its_shared_scores():
    members, *_ = sim_traces(N_PROBLEMS // 2, identical_step_rate=0.0, round_score_share=0.0)
    on0, off0 = F.score_equality(members), F.score_equality(members, on_track=False)
    members, *_ = sim_traces(N_PROBLEMS // 2, identical_step_rate=0.0, round_score_share=0.7,
                             wrong_score_overlap=0.4)  # fmt: skip
    share = F.shared_score_share(F.score_equality(members), on0)
    assert share == pytest.approx(0.7, abs=0.08)
    assert F.wrong_score_overlap(F.score_equality(members, on_track=False), off0, share) == pytest.approx(0.4, abs=0.1)
