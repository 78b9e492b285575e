"""Calibration, develop and sealed targets: disjoint, each mapped to sim cells and paper rows."""
from __future__ import annotations

import pytest

from specscale.calibration.targets import (CALIBRATION, DEVELOP, NOT_PRODUCED, SEALED, TARGETS, Target, cells_of,
                                           paper_rows)
from specscale.compose import compose_config

SETS = {"calibrate": CALIBRATION, "develop": DEVELOP, "sealed": SEALED}


def test_the_three_sets_are_disjoint_in_rows_and_names():
    for a, ta in SETS.items():
        for b, tb in SETS.items():
            if a < b:
                assert not {t.csv_row for t in ta if t.csv_row is not None} & \
                    {t.csv_row for t in tb if t.csv_row is not None}, (a, b)
                assert not {t.name for t in ta} & {t.name for t in tb}, (a, b)


def test_every_paper_row_is_fitted_held_out_or_named_as_not_produced():
    used = {t.csv_row for t in TARGETS.values() if t.csv_row is not None}
    figures = set(paper_rows().loc[sorted(set(paper_rows().index) - used), "figure"])
    assert figures <= set(NOT_PRODUCED), f"paper rows neither fitted, held out nor explained: {figures - set(NOT_PRODUCED)}"


def test_every_held_out_target_maps_to_sim_cells():
    for t in (*DEVELOP, *SEALED):
        assert t.cells, t.name
    for c in cells_of((*DEVELOP, *SEALED)).values():
        cfg = compose_config([*c.overrides, "n_problems=4"])
        assert cfg["engine"]["name"] == "sim", c.name


@pytest.mark.parametrize("rule,pred,ok,res", [
    ("rel", 115.0, True, 1.0), ("rel", 80.0, False, -4 / 3), ("range", 2.5, True, 0.0), ("range", 4.0, False, 1.0),
    ("below", 0.9, True, 0.0), ("below", 1.1, False, None),
])
def test_rules_and_residuals(rule, pred, ok, res):
    t = Target("t", (), lambda s: 0.0, 100.0 if rule == "rel" else (2.0 if rule == "range" else 1.0), rule=rule,
               high=3.0 if rule == "range" else None)
    assert t.passes(pred) is ok
    if res is not None:
        assert t.residual(pred) == pytest.approx(res)
    else:
        assert t.residual(pred) > 0


def test_the_paper_concurrency_is_the_configured_default():
    from specscale.calibration.targets import PAPER_CONCURRENCY

    assert compose_config([])["concurrency"] == PAPER_CONCURRENCY


def _target(prefix: str) -> Target:
    (t,) = [t for t in TARGETS.values() if t.name.startswith(prefix)]
    return t


def test_serving_knee_reads_the_crossing_rate_of_the_normalised_latency_curve():
    t = _target("serving knee: full")
    lat = [40.0, 50.0, 60.0, 70.0, 80.0, 200.0]  # crosses 75 halfway between 1.6 and 2.0 req/s
    s = {c.name: {"norm_latency_ms_per_output_tok": y} for c, y in zip(t.cells, lat)}
    assert t.measure(s) == pytest.approx(1.8)
    assert t.passes(t.measure(s))
    s = {c.name: {"norm_latency_ms_per_output_tok": 90.0} for c in t.cells}  # above the level from the start
    assert t.measure(s) == 0.0 and not t.passes(0.0)
    s = {c.name: {"norm_latency_ms_per_output_tok": 10.0} for c in t.cells}  # never reaches it
    assert t.measure(s) == float("inf") and not t.passes(float("inf"))


def test_concurrency_saturation_is_the_first_limit_within_five_percent_of_the_best():
    nonspec, full = _target("concurrency saturation: nonspec"), _target("concurrency saturation: full")
    flat = {c.name: {"output_tok_s": y} for c, y in zip(nonspec.cells, [300.0, 500.0, 600.0, 610.0])}
    assert nonspec.measure(flat) == 64.0 and nonspec.passes(64.0)
    rising = {c.name: {"output_tok_s": y} for c, y in zip(full.cells, [300.0, 500.0, 600.0, 700.0])}
    assert full.measure(rising) == float("inf") and full.passes(float("inf"))
    early = {c.name: {"output_tok_s": y} for c, y in zip(full.cells, [300.0, 600.0, 610.0, 615.0])}
    assert full.measure(early) == 32.0 and not full.passes(32.0)
