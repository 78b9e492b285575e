"""The shipped PRM checks steps: a right step scores above the same step with a planted
error (same question, same prefix), through the harness's own PRM loader."""

import random

import pytest
import torch

from specscale.data.arith import held_out_problems
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.testbed import checkpoint_dir
from specscale.testbed.prm_data import plant

pytestmark = pytest.mark.usefixtures("one_thread")
N_EXAMPLES = 60
# Measured with the shipped weights: 43 of 60 pairs ordered right (planted errors of every
# kind; the PRM is better on the generator's own slips: AUC 0.90 at its first wrong steps,
# 0.77 on planted ones). A PRM that cannot tell orders ~30 of 60 (P(>= 39) ~ 1% by chance).
FLOOR = 39 / 60


def pairs():
    rng = random.Random(7)
    for p in held_out_problems(N_EXAMPLES):
        at = rng.randint(0, len(p.ops))
        wrong = plant(p, rng, at)
        e = wrong.first_error  # == at, or earlier for an answer boxed before the last operation
        yield p.question, p.steps()[: e + 1], list(wrong.steps[: e + 1])


def test_right_step_scores_above_the_planted_error():
    prm = ProcessRewardModel(checkpoint_dir("prm"), dtype=torch.float32)
    ordered = 0
    for question, right, wrong in pairs():
        assert right[:-1] == wrong[:-1] and right[-1] != wrong[-1]
        r, w = prm.score_paths(question, [right, wrong])
        ordered += r[-1] > w[-1]
    assert ordered / N_EXAMPLES >= FLOOR, ordered
