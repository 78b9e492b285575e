"""The throughput-reading table: both readings of our cells beside the paper's numbers."""
from __future__ import annotations

import pytest

from analysis import paper, table_throughput_reading as R
from analysis_cells import cells_of


@pytest.fixture(scope="module")
def ref():
    return paper.load_reference()


def test_both_readings_beside_the_beam_trend_and_the_knee(ref):
    # Logical throughput rises with the beam while output throughput falls, as the paper's does.
    cells = cells_of([
        {"policy": "nonspec", "beam": 4, "seed": 0, "output_tok_s": 500.0, "logical_tok_s": 2000.0},
        {"policy": "nonspec", "beam": 8, "seed": 0, "output_tok_s": 300.0, "logical_tok_s": 2600.0},
        {"policy": "full", "beam": 4, "seed": 0, "output_tok_s": 700.0, "logical_tok_s": 2500.0,
         "output_tokens": 64 * 500, "logical_tokens": 64 * 4000, "n_requests": 64},
    ])
    t = R.reading_table(cells, ref).set_index("comparison")
    assert t.loc["nonspec tok/s at beam 4", "paper"] == 558
    assert t.loc["nonspec tok/s at beam 8", "output"] == 300.0
    trend = t.loc["nonspec beam 8 / beam 4"]
    assert trend["paper"] == pytest.approx(327 / 558)
    assert trend["output"] == pytest.approx(0.6) and trend["logical"] == pytest.approx(1.3)
    knee = t.loc["knee 1.6 req/s x our tokens per request (full, beam 4)"]
    assert knee["paper"] == 786
    assert knee["output"] == pytest.approx(1.6 * 500) and knee["logical"] == pytest.approx(1.6 * 4000)
    assert knee["output_vs_paper"] == pytest.approx(800 / 786)


def test_nothing_comparable_is_reported_missing(ref, tmp_path):
    cells = cells_of([{"policy": "spec", "beam": 16, "seed": 0, "output_tok_s": 1.0, "logical_tok_s": 1.0}])
    sec = R.build(cells, ref, tmp_path)
    assert not sec.drawn and sec.missing
