"""The paper's reference numbers: every value is quoted from the review, and lookups
match our cells by model, dataset and beam."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from analysis import paper

REVIEW = Path(__file__).resolve().parents[3] / "shared" / "seed" / "specscale-review.txt"
FIGURES = {"fig13", "fig13_ratio", "fig15", "fig16", "table2", "serving", "concurrency", "beam_scaling",
           "prm_batches", "dedup"}


def _norm(text: str) -> str:
    text = text.replace("’", "'").replace("“", '"').replace("”", '"').replace("\u2011", "-")
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def ref():
    return paper.load_reference()


def test_reference_has_the_expected_shape(ref):
    assert list(ref.columns) == list(paper.COLUMNS)
    assert set(ref["figure"]) == FIGURES
    assert set(ref["relation"]) <= {"=", "~", "<", ">", "range"}
    assert ref["source"].str.startswith("docs/paper.md §").all()
    assert (ref["hardware"] == "A100 80GB").all()


@pytest.mark.skipif(not REVIEW.is_file(), reason="the review text is not beside this checkout")
def test_every_value_is_quoted_from_the_review(ref):
    review = _norm(REVIEW.read_text())
    for row in ref.itertuples():
        quote = _norm(row.quote)
        for part in (p.strip() for p in quote.split("...")):
            assert part in review, f"row {row.Index}: not in the review: {part!r}"
        if row.relation in ("=", "~"):
            v = float(row.value)
            forms = {f"{v:g}", f"{v:.1f}", f"{v:.2f}", f"{v:,.0f}"}
            assert any(f in quote for f in forms), f"row {row.Index}: {v} not in its quote"


def test_fig13_values_and_the_headline_arithmetic(ref):
    v = lambda pol, beam, model="qwen2.5-7b": paper.value(ref, "fig13", "output_tok_s", model=model,  # noqa: E731
                                                           dataset="math500", beam=beam, policy=pol)
    assert (v("full", 8), v("spec", 8), v("fasttts", 8), v("nonspec", 8)) == (466, 214, 249, 327)
    assert (v("ep", 8), v("ep_cd", 8), v("full", 4), v("nonspec", 4)) == (338, 414, 786, 558)
    assert [v(p, 8, "qwen2.5-3b") for p in ("nonspec", "ep", "ep_cd", "full")] == [317, 375, 411, 479]
    # The stated headline ratios follow from the stated bars.
    ratio = lambda den: paper.value(ref, "fig13_ratio", "throughput_ratio", model="qwen2.5-7b",  # noqa: E731
                                    dataset="math500", beam=8, policy="full", baseline=den)
    assert ratio("spec") == pytest.approx(466 / 214, abs=0.005)
    assert ratio("fasttts") == pytest.approx(466 / 249, abs=0.005)
    assert ratio("nonspec") == pytest.approx(466 / 327, abs=0.005)


def test_lookups_match_blanks_fixtures_and_bounds(ref):
    # A fixture dataset is compared with its benchmark's numbers.
    assert paper.value(ref, "fig13", "output_tok_s", model="qwen2.5-7b", dataset="fixture_math500",
                       beam=8, policy="full") == 466
    # Other models, beams or datasets find nothing.
    assert math.isnan(paper.value(ref, "fig13", "output_tok_s", model="llama3.1-8b", dataset="math500",
                                  beam=8, policy="full"))
    assert math.isnan(paper.value(ref, "fig13", "output_tok_s", model="qwen2.5-7b", dataset="math500",
                                  beam=16, policy="full"))
    # A blank model in the reference (the review does not say) matches any model.
    rows = paper.rows(ref, "concurrency", "saturation_concurrency", model="llama3.2-3b", beam=4, policy="nonspec")
    assert rows["value"].tolist() == [64]
    # Only a bound is stated at 4,096 tokens: value() gives no number, rows() keep the bound.
    assert math.isnan(paper.value(ref, "fig16", "throughput_ratio", model="qwen2.5-3b", dataset="math500",
                                  beam=8, x_value=4096))
    b = paper.rows(ref, "fig16", "throughput_ratio", model="qwen2.5-3b", beam=8, x_value=4096)
    assert b["relation"].tolist() == ["<"] and b["value"].tolist() == [1.0]
    assert paper.value(ref, "fig16", "throughput_ratio", model="qwen2.5-3b", beam=8, x_value=2048) == 1.14


def test_missing_reference_file_is_a_loud_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        paper.load_reference(tmp_path / "absent.csv")
