"""Fitting the sim's synthetic workload to testbed traces: each estimator recovers known
constants, the trace labeller rebuilds lineage and checks steps, and the fitted profile
(conf/synthetic/testbed.yaml) composes and reaches the sim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from specscale.hashing import child_key, root_key
from specscale.engine.synthetic.workload import WorkloadParams
from specscale.calibration import workload_fit as F
from specscale.testbed.traces import member_frame

PROFILE = Path(__file__).resolve().parents[2] / "conf" / "synthetic" / "testbed.yaml"


def test_discrete_lognormal_fit_recovers_the_sims_law():
    rng = np.random.default_rng(0)
    lengths = np.ceil(np.exp(np.log(8.0) + 0.3 * rng.standard_normal(5000)))  # as lognormal_hazard discretises
    median, sigma = F.discrete_lognormal_fit(lengths)
    assert median == pytest.approx(8.0, rel=0.03) and sigma == pytest.approx(0.3, rel=0.08)


def test_hazard_fit_recovers_the_difficulty_law():
    rng = np.random.default_rng(1)
    rows = []
    for p, h in enumerate(rng.beta(1.0, 3.0, size=400)):  # mean 0.25, concentration 4
        lost = rng.binomial(30, h)
        rows += [{"problem_id": p, "level": 2, "parent_on_track": True, "on_track": i >= lost} for i in range(30)]
    rows += [{"problem_id": 0, "level": 2, "parent_on_track": False, "on_track": False}] * 50  # not tried: ignored
    mean, conc, per = F.hazard_fit(pd.DataFrame(rows))
    assert mean == pytest.approx(0.25, abs=0.02) and conc == pytest.approx(4.0, rel=0.25)
    assert per["tried"].sum() == 400 * 30


def test_sibling_collision_counts_only_positions_with_a_shared_prefix():
    members = pd.DataFrame({"parent": [1, 1, None], "group": [(0, 1), (0, 1), (0, None)],
                            "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 0, 9], [1, 2]]})
    head, body, share = F.sibling_collision(members, head_tokens=2)
    assert head == 1.0  # positions 0, 1 agree
    assert body == 0.5  # position 2 agrees, position 3 differs, position 4 is after the split
    assert share == pytest.approx(4 / 5)


def test_member_frame_rebuilds_lineage_and_checks_steps():
    # "Compute 3+4+1.": reference 3+4=7 / 7+1=8 / The answer is \boxed{8}.
    vocab = {1: "3+4=7\n\n", 2: "3+4=6\n\n", 3: "7+1=8\n\n", 4: "6+1=7\n\n"}
    seed, beam, m = 0, 2, 2
    r0 = [child_key(root_key(seed, 0), j) for j in range(beam)]
    r1 = [child_key(r0[1], j) for j in range(m)]
    rounds = [{"request_id": 0, "round": 0, "member_keys": r0, "member_texts": [[2], [1]], "member_scores": [0.2, 0.9],
               "member_terminal": [False, False], "selected_keys": [r0[1]]},
              {"request_id": 0, "round": 1, "member_keys": r1, "member_texts": [[3], [4]],
               "member_scores": [0.8, 0.1], "member_terminal": [False, False], "selected_keys": []}]
    df = member_frame(rounds, [{"request_id": 0, "problem_id": "p"}], {"p": "Compute 3+4+1."},
                      lambda ids: "".join(vocab[i] for i in ids), seed, beam, m)
    assert df["on_track"].tolist() == [False, True, True, False]
    assert df["parent"].tolist()[2:] == [r0[1], r0[1]] and df["parent"].iloc[0] is None
    assert df["level"].unique().tolist() == [2] and df["n_tokens"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("model, dataset", [("testbed", "arith"), ("testbed_levels", "arith_levels")])
def test_fitted_profile_composes_and_reaches_the_sim(model, dataset):
    from specscale.settings.pairings import testbed_pair

    synthetic = testbed_pair(model).synthetic
    profile = PROFILE.parent / f"{synthetic}.yaml"
    if not profile.is_file():
        pytest.skip(f"no fitted profile (python -m runners.fit_testbed_workload --model {model})")
    assert "FITTED BY CODE" in profile.read_text() and f"model={model} " in profile.read_text()
    import yaml

    written = yaml.safe_load(profile.read_text())["engine"]["synthetic"]
    # The mechanisms are fitted too, not left to the engine's defaults.
    assert {"identical_step_rate", "sibling_error_correlation", "error_round_decay", "problem_step_correlation",
            "off_track_correct_share", "prm_step_sensitivity"} <= set(written)
    from specscale.cell import build_server

    cfg = compose_cfg("engine=sim", f"model={model}", f"synthetic={synthetic}", "beam=4", "n_problems=8",
                      "wandb.mode=disabled", small=False)
    syn = cfg["engine"]["synthetic"]
    WorkloadParams.from_config(syn)  # every fitted key is a known, valid setting
    assert syn == {**syn, **written} and syn["error_rate"] == 1.0 and cfg["dataset"]["name"] == dataset
    rec = build_server(cfg).run()
    lengths = [len(t) for rd in rec.rounds for t in rd["member_texts"]]
    # The roofline default is 40 tokens per step; the testbed's steps are a few tokens.
    assert np.median(lengths) == pytest.approx(syn["step_len_median"], rel=0.35)


def test_sibling_loss_correlation_sees_shared_mistakes():
    # Two on-track parents, 2 children each: both children of parent 1 lost, none of parent 2.
    members = pd.DataFrame({"parent": [1, 1, 2, 2], "group": [(0, 1), (0, 1), (0, 2), (0, 2)],
                            "parent_on_track": [True] * 4, "on_track": [False, False, True, True]})
    p, p_sib = F.sibling_loss_correlation(members)
    assert p == 0.5 and p_sib == 1.0


def test_the_prm_sensitivity_fit_recovers_a_known_value_through_the_sim():
    """The sim's within-round AUC at a known sensitivity is the target; the fit finds the
    sensitivity back (the AUC falls with it: 0.88 at 1, 0.62 at 0.3 at 300 problems)."""
    if not PROFILE.is_file():
        pytest.skip("no fitted profile (python -m runners.fit_testbed_workload)")
    import argparse

    from runners.fit_testbed_workload import fit_prm_step_sensitivity, sim_within_round_auc

    args = argparse.Namespace(beam=8, seed=0, sensitivity_problems=120, synthetic="testbed", model="testbed")
    target = sim_within_round_auc(0.5, args)
    fitted = fit_prm_step_sensitivity(target, args)
    assert fitted["status"] == "converged" and fitted["value"] == pytest.approx(0.5, abs=0.12)
    assert sim_within_round_auc(1.0, args) > target + 0.05


def test_the_levels_fit_draws_its_own_problems_across_levels(tmp_path):
    """The levels pair's fit problems: deterministic, every level 1-5 in about equal shares,
    none of them a question of a held-out split (the levels test split, the hard split, the
    shipped arith split)."""
    import json
    from collections import Counter

    from runners.fit_testbed_workload import common, fit_problem_file
    from specscale.data.arith import levels_held_out_questions

    path = fit_problem_file(200, tmp_path, "arith_levels")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 200 and len({r["problem"] for r in rows}) == 200
    assert not {r["problem"] for r in rows} & levels_held_out_questions()
    counts = Counter(r["level"] for r in rows)
    assert set(counts) == {1, 2, 3, 4, 5} and min(counts.values()) >= 25, counts
    (tmp_path / "again").mkdir()
    again = fit_problem_file(200, tmp_path / "again", "arith_levels")
    assert again.read_text() == path.read_text()
    assert common("testbed_levels")[:2] == ("model=testbed_levels", "dataset=arith_levels")
