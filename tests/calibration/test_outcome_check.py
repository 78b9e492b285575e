"""The outcome check of a workload fit: coverage, selection and per-problem repeats."""
from __future__ import annotations

import argparse

import pandas as pd
import pytest

from specscale.calibration.outcome_check import outcome_stats

pytestmark = pytest.mark.usefixtures("one_thread")


def _member(rid, round_, on_track, terminal):
    return {"request_id": rid, "round": round_, "on_track": on_track, "terminal": terminal}


def test_coverage_selection_and_repeats_on_known_searches():
    members = pd.DataFrame([
        _member(1, 0, True, False), _member(1, 1, True, True), _member(1, 1, False, True),  # covered, correct
        _member(2, 0, True, False), _member(2, 1, False, True),  # lost its on-track path: not covered
        _member(3, 0, True, True),  # covered, but the vote picked a wrong path
        _member(4, 0, False, True),  # not covered, right answer anyway (an error that kept the result)
    ])
    requests = [{"request_id": 1, "problem_id": "a", "correct": True}, {"request_id": 2, "problem_id": "a", "correct": False},
                {"request_id": 3, "problem_id": "b", "correct": False}, {"request_id": 4, "problem_id": "b", "correct": True}]
    st = outcome_stats(members, requests)
    assert (st["searches"], st["problems"], st["accuracy"], st["coverage"]) == (4, 2, 0.5, 0.5)
    assert st["correct_given_covered"] == 0.5 and st["correct_given_not_covered"] == 0.5
    assert st["on_track_share_of_finished_in_covered"] == round(2 / 3, 4)  # requests 1 and 3: 2 of 3 finished paths
    assert st["problems_by_covered_searches"] == {1: 2} and st["problems_by_correct_searches"] == {1: 2}


def test_the_runner_reads_the_sim_as_it_reads_the_testbed():
    # The sim's own traces given as the "testbed": both sides of the check must agree exactly.
    from runners.fit_testbed_workload import SEARCH_STRIDE, common, outcome_check
    from specscale.calibration.sim_traces import sim_member_frame
    from specscale.cell import build_server
    from specscale.compose import compose_config

    args = argparse.Namespace(beam=4, fit_problems=5, fit_searches=2, seed=3, synthetic="testbed", model="testbed")
    frames, requests = [], []
    for k in range(2):
        server = build_server(compose_config(["engine=sim", *common("testbed"), "synthetic=testbed", "policy=nonspec", "beam=4",
                                              "expansion=4", "n_problems=5", f"seed={3 + k}"], resolve=True))  # fmt: skip
        rec = server.run()
        m = sim_member_frame(server)
        frames.append(m.assign(request_id=m["request_id"] + k * SEARCH_STRIDE))
        requests += [{**r, "request_id": r["request_id"] + k * SEARCH_STRIDE} for r in rec.requests]
    out = outcome_check(pd.concat(frames, ignore_index=True), requests, args)
    assert out["testbed"] == out["sim"]
    assert out["sim"]["searches"] == 10 and out["sim"]["problems"] == 5
    assert sum(out["sim"]["problems_by_covered_searches"].values()) == 5
