"""The synthetic workload: a function of history, with its knobs doing what they say."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.engine.synthetic.problems import synthetic_problems
from specscale.engine.synthetic.workload import SyntheticWorkload, WorkloadParams, measure_sibling_overlap


def test_distribution_is_a_function_of_history():
    w = SyntheticWorkload(WorkloadParams(), 0.8)
    h = np.array([12345, 12345, 999], dtype=np.uint64)
    p = w.probabilities(h, np.array([5, 5, 5]), np.array([1, 1, 1]))
    assert np.allclose(p.sum(1), 1.0)
    assert np.array_equal(p[0], p[1]) and not np.array_equal(p[0], p[2])


def test_sibling_overlap_spans_the_papers_range():
    low = measure_sibling_overlap(SyntheticWorkload(WorkloadParams(token_overlap=0.75), 0.8), n_groups=60)
    high = measure_sibling_overlap(SyntheticWorkload(WorkloadParams(token_overlap=0.93), 0.8), n_groups=60)
    assert low <= 0.27 and high >= 0.46  # the knob covers 25-50% common sibling tokens at T=0.8


def test_step_lengths_are_long_tailed():
    w = SyntheticWorkload(WorkloadParams(step_len_median=40, step_len_sigma=0.8), 0.8)
    surv = np.cumprod(1 - w._stop)
    median = int(np.argmax(surv < 0.5)) + 1
    p99 = int(np.argmax(surv < 0.01)) + 1
    assert 35 <= median <= 45 and p99 > 4 * median


def test_problems_are_fixed_and_validated():
    a = synthetic_problems("math500", 5, 0.55, 120)
    assert a == synthetic_problems("math500", 5, 0.55, 120)
    assert a != synthetic_problems("gsm8k", 5, 0.55, 120)
    with pytest.raises(ValueError):
        synthetic_problems("x", 0, 0.5, 10)


def test_cd_ratio_falls_below_one_when_overlap_is_high():
    ratio = {}
    for ov in (0.3, 0.95):
        cfg = compose_cfg("policy=nonspec_cd", "beam=8", f"engine.synthetic.token_overlap={ov}",
                          f"engine.synthetic.head_overlap={max(ov, 0.5)}",
                          "engine.synthetic.identical_step_rate=0")  # token overlap alone
        rec = build_server(cfg).run()
        it = pd.DataFrame(rec.iterations)
        ratio[ov] = it["physical_rows"].sum() / it["logical_draws"].sum()
    assert ratio[0.95] < 0.8 < ratio[0.3] <= 1.0


def test_rewards_follow_the_latent_correctness():
    """PRM rewards are higher on track, with the configured share of exact 1.0."""
    from specscale.hashing import mix64

    w = SyntheticWorkload(WorkloadParams(exact_one_share=0.4, off_track_one_factor=0.1), 0.8)
    hashes = [mix64(i) for i in range(20000)]
    on = np.array([w._draw_reward(h, True) for h in hashes])
    off = np.array([w._draw_reward(h, False) for h in hashes])
    assert (on == 1.0).mean() == pytest.approx(0.4, abs=0.02)
    assert (off == 1.0).mean() == pytest.approx(0.04, abs=0.01)
    assert on.mean() > off.mean() + 0.2
    assert on.min() >= 0.0 and off.max() <= 1.0

