"""The equivalence contract (docs/design.md §4): policies change cost, never results."""
from __future__ import annotations

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from contract import EQUIVALENT
from specscale.cell import build_server

CONFIGS = [
    ["beam=4", "expansion=2", "concurrency=1", "seed=1"],
    ["beam=8", "expansion=4", "concurrency=16", "seed=2"],
    ["beam=8", "expansion=2", "concurrency=4", "seed=3", "workload=poisson", "workload.rate=2.0"],
    ["beam=4", "expansion=4", "concurrency=16", "seed=4", "workload=poisson", "workload.rate=0.5"],
    ["beam=8", "expansion=4", "concurrency=2", "seed=5", "search.score_agg=min", "policy.b_max=256"],
]


def tree(policy: str, overrides: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rec = build_server(compose_cfg(f"policy={policy}", *overrides)).run()
    rounds = pd.DataFrame(rec.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)
    cols = ["request_id", "round", "member_keys", "member_texts", "member_scores", "member_terminal", "selected_keys"]
    answers = pd.DataFrame(rec.requests).sort_values("request_id").reset_index(drop=True)
    return rounds[cols], answers[["request_id", "answer", "answer_best_single", "answer_majority", "logical_tokens"]]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o))
def test_policies_build_identical_trees(overrides):
    ref_rounds, ref_answers = tree("nonspec", overrides)
    assert len(ref_rounds) > 4 * 2  # the search ran several rounds per request
    for policy, extra in EQUIVALENT[1:]:
        rounds, answers = tree(policy, [*overrides, *extra])
        pd.testing.assert_frame_equal(rounds, ref_rounds, obj=f"rounds of {policy}")
        pd.testing.assert_frame_equal(answers, ref_answers, obj=f"answers of {policy}")


def test_speculation_really_ran_ahead():
    """Guard against a vacuous contract: the speculative run did work the baseline did not."""
    ovr = ["beam=8", "concurrency=4", "seed=7"]
    spec = build_server(compose_cfg("policy=spec", *ovr)).run()
    base = build_server(compose_cfg("policy=nonspec", *ovr)).run()
    drawn = lambda rec: sum(r["logical_draws"] for r in rec.iterations)
    assert drawn(spec) > drawn(base)
    assert sum(r["speculative_rows"] for r in spec.iterations) > 0
    assert sum(r["speculative_rows"] for r in base.iterations) == 0
