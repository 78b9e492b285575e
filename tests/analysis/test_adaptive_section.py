"""The adaptive-verification section: best fixed B_max per context, paired by seed."""
from __future__ import annotations

import pytest

from analysis import fig_adaptive
from analysis_cells import cells_of


def _cells(adaptive, fixed, ep_cd):
    """adaptive / ep_cd: tok/s per seed; fixed: {b_max: tok/s per seed}."""
    rows = []
    for seed, v in enumerate(adaptive):
        rows.append({"policy": "adaptive", "policy_b_max": 2048, "seed": seed, "beam": 8, "output_tok_s": v,
                     "latency_p99_s": 10.0})
    for b, vals in fixed.items():
        for seed, v in enumerate(vals):
            rows.append({"policy": "full", "policy_b_max": b, "seed": seed, "beam": 8, "output_tok_s": v,
                         "latency_p99_s": 12.0, "variant": "" if b == 2048 else f"b_max={b}"})
    for seed, v in enumerate(ep_cd):
        rows.append({"policy": "ep_cd", "policy_b_max": 2048, "seed": seed, "beam": 8, "output_tok_s": v,
                     "latency_p99_s": 11.0})
    return cells_of(rows)


def test_the_best_fixed_threshold_is_chosen_per_context_and_compared_by_seed():
    cells = _cells([100.0, 104.0, 98.0], {512: [90.0, 91.0, 89.0], 2048: [101.0, 103.0, 99.0],
                                          4096: [95.0, 96.0, 94.0]}, [92.0, 93.0, 91.0])
    (row,) = fig_adaptive.adaptive_table(cells).to_dict("records")
    assert row["best_fixed_b_max"] == 2048 and row["n_seeds"] == 3
    assert row["adaptive_vs_best"] == pytest.approx((100 / 101 + 104 / 103 + 98 / 99) / 3)
    assert row["matches_best"] and not row["below_ep_cd"]
    assert row["p99_vs_best"] == pytest.approx(10 / 12)


def test_a_consistent_loss_to_the_best_threshold_is_reported_as_a_miss():
    cells = _cells([90.0, 91.0, 89.5], {1024: [100.0, 101.0, 99.0], 4096: [80.0, 81.0, 79.0]},
                   [95.0, 96.0, 94.0])
    (row,) = fig_adaptive.adaptive_table(cells).to_dict("records")
    assert row["best_fixed_b_max"] == 1024 and not row["matches_best"] and row["below_ep_cd"]
    assert "0/1 contexts" in fig_adaptive.headline(fig_adaptive.adaptive_table(cells))


def test_section_names_the_sweep_when_cells_are_missing(tmp_path):
    sec = fig_adaptive.build(_cells([], {2048: [100.0]}, []), None, tmp_path)
    assert any("+experiment=adaptive_eval" in m for m in sec.missing)
    sec = fig_adaptive.build(_cells([100.0, 101.0], {1024: [99.0, 100.0], 2048: [98.0, 99.0]}, [97.0, 98.0]),
                             None, tmp_path)
    assert not sec.missing and sec.tables and "1/1 contexts" in sec.notes[0]


def test_serving_table_pairs_p99_by_seed_at_each_rate(tmp_path):
    rows = []
    for seed in (0, 1):
        for pol, b, p99 in (("adaptive", 2048, 9.0 + seed), ("full", 512, 10.0 + seed), ("full", 2048, 11.0 + seed),
                            ("ep_cd", 2048, 12.0 + seed)):
            rows.append({"policy": pol, "policy_b_max": b, "seed": seed, "beam": 4, "workload": "poisson",
                         "rate": 1.6, "latency_p99_s": p99, "norm_latency_ms_per_output_tok": 50.0,
                         "output_tok_s": 100.0, "variant": "b_max=512" if (pol, b) == ("full", 512) else ""})
    (row,) = fig_adaptive.serving_table(cells_of(rows)).to_dict("records")
    assert row["best_fixed_b_max"] == 512 and row["n_seeds"] == 2
    assert row["p99_vs_best"] == pytest.approx((9 / 10 + 10 / 11) / 2)
    assert row["p99_vs_ep_cd"] == pytest.approx((9 / 12 + 10 / 13) / 2)
    sec = fig_adaptive.build(cells_of(rows), None, tmp_path)
    assert any("Serving" in caption for caption, *_ in sec.tables)
