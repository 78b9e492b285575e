"""Calibration and validation targets: disjoint, each mapped to sim cells and paper rows."""
from __future__ import annotations

import pytest

from specscale.calibration.targets import (CALIBRATION, NOT_PRODUCED, VALIDATION, Target, cells_of, paper_rows)
from specscale.compose import compose_config


def test_the_two_lists_are_disjoint():
    cal_rows = {t.csv_row for t in CALIBRATION if t.csv_row is not None}
    val_rows = {t.csv_row for t in VALIDATION if t.csv_row is not None}
    assert not cal_rows & val_rows
    assert not {t.name for t in CALIBRATION} & {t.name for t in VALIDATION}


def test_every_paper_row_is_fitted_held_out_or_named_as_not_produced():
    used = {t.csv_row for t in (*CALIBRATION, *VALIDATION) if t.csv_row is not None}
    figures = set(paper_rows().loc[sorted(set(paper_rows().index) - used), "figure"])
    assert figures <= set(NOT_PRODUCED), f"paper rows neither fitted, held out nor explained: {figures - set(NOT_PRODUCED)}"


def test_every_held_out_target_maps_to_sim_cells():
    for t in VALIDATION:
        assert t.cells, t.name
    for c in cells_of(VALIDATION).values():
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
