"""What a fitted workload must also reproduce: the searches' outcomes on the fit data.

The workload fitter (``workload_fit``) matches round-level statistics of the traces (how
many children of a group lose track, step lengths, scores). A search's *outcome* is made
of them but not fixed by them: whether a search still holds an on-track path when it ends
(coverage), whether its vote picks it, and how a problem's outcome repeats across
independent searches. This module reads those statistics from member frames
(``specscale.testbed.traces.member_frame`` for the testbed, ``sim_traces.sim_member_frame``
for the sim) and the requests, so the fit can be checked against the same searches it was
fitted on: a posterior predictive check, not a validation (the held-out comparison is
accuracy vs beam on the test split).
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd


def outcome_stats(members: pd.DataFrame, requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, coverage (a finished on-track path), P(correct | covered), P(correct | not
    covered), the on-track share of finished paths in covered searches, and per problem how
    many of its searches were covered / correct (``{k: problems}``; k = 0..searches)."""
    req = pd.DataFrame(list(requests))
    if not len(req):
        raise ValueError("outcome_stats needs at least one request")
    req = req.set_index("request_id")
    finished = members[members["terminal"].astype(bool)]
    covered_by = finished.groupby("request_id")["on_track"].any()
    req["covered"] = covered_by.reindex(req.index, fill_value=False).astype(bool)
    req["correct"] = req["correct"].fillna(False).astype(bool)
    covered, missed = req[req["covered"]], req[~req["covered"]]
    in_covered = finished[finished["request_id"].map(covered_by).fillna(False).astype(bool)]
    per_problem = req.groupby("problem_id")[["covered", "correct"]].sum()
    return {
        "searches": len(req), "problems": int(per_problem.shape[0]),
        "accuracy": round(float(req["correct"].mean()), 4),
        "coverage": round(float(req["covered"].mean()), 4),
        "correct_given_covered": round(float(covered["correct"].mean()), 4) if len(covered) else None,
        "correct_given_not_covered": round(float(missed["correct"].mean()), 4) if len(missed) else None,
        "on_track_share_of_finished_in_covered": round(float(in_covered["on_track"].mean()), 4) if len(in_covered) else None,
        "problems_by_covered_searches": _histogram(per_problem["covered"]),
        "problems_by_correct_searches": _histogram(per_problem["correct"]),
    }  # fmt: skip


def _histogram(counts: pd.Series) -> dict[int, int]:
    return {int(k): int(v) for k, v in counts.astype(int).value_counts().sort_index().items()}
