"""Float64 search trees on the torch backend are those of before the host-path work:
batch building, PRM inputs and sampling changed how the host prepares work,
never what the search computes. The fingerprints below were recorded at commit 4dcbef5,
before any change, on the hidden-style config (beam 12, expansion 3, concurrency 5,
Poisson arrivals); scores enter rounded to 1e-9 (float64 PRM scores agree to ~1e-12
across batchings, so a platform's last bits do not move them)."""
from __future__ import annotations

import hashlib

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import ANSWER_COLS, TREE_COLS, frames
from specscale.cell import build_server

HIDDEN_STYLE = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=5", "search.temperature=1.0", "search.max_rounds=5", "search.step_token_cap=12",
    "search.path_token_cap=48", "wandb.mode=disabled",
    "beam=12", "expansion=3", "concurrency=5", "seed=11", "workload=poisson", "workload.rate=4.0",
]
# sha256 of (tree, scores to 1e-9, answers), recorded before the change; the same for every
# policy (the equivalence contract; ``full`` keeps its perfect-score shortcut, which this
# config never triggers).
RECORDED_TREE = "0180139808529ca457d21f29c078ce8bca980e274254bc360f03e115321492e8"
POLICIES = ("nonspec", "spec", "full")


def fingerprint(rec) -> str:
    rounds, answers = frames(rec)
    h = hashlib.sha256()
    for row in rounds[TREE_COLS].itertuples(index=False):
        h.update(repr(tuple(row)).encode())
    for scores in rounds["member_scores"]:
        h.update(repr([f"{float(s):.9f}" for s in scores]).encode())
    for row in answers[ANSWER_COLS].itertuples(index=False):
        h.update(repr(tuple(row)).encode())
    return h.hexdigest()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.parametrize("policy", POLICIES)
def test_tree_is_the_recorded_one(policy):
    rec = build_server(compose_cfg(*HIDDEN_STYLE, f"policy={policy}", small=False)).run()
    rounds, _ = frames(rec)
    assert len(rounds) >= 15 and any(len(set(s)) > 1 for s in rounds["member_scores"])
    assert fingerprint(rec) == RECORDED_TREE
