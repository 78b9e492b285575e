"""The report's testbed section: statistics of a hand-made benchmark record, the tables
and figures it draws, and a clear line naming the command when there is no record."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import testbed
from analysis import testbed_tables as T

PROBLEMS = [f"arith/test/{i}" for i in range(12)]


def requests() -> pd.DataFrame:
    """nonspec, ep_strict (same outcomes), ep (loses problems 0 and 1) and full at beams 1 and 8."""
    rows = []
    base = {1: [i % 2 == 0 for i in range(12)], 8: [i % 3 != 0 for i in range(12)]}
    for beam, ok in base.items():
        for policy in ("nonspec", "ep_strict", "ep", "full"):
            got = [c and not (policy == "ep" and i < 2) for i, c in enumerate(ok)]
            for i, (pid, c) in enumerate(zip(PROBLEMS, got)):
                rows.append({"policy": policy, "beam": beam, "expansion": min(4, beam), "problem_id": pid,
                             "level": 2 + i % 3, "correct": c, "latency_s": 0.1 * (i + 1) * beam,
                             "shortcut_rounds": 0, "makespan_s": 1.2 * beam})
    return pd.DataFrame(rows)


def baselines() -> pd.DataFrame:
    return pd.DataFrame({"problem_id": PROBLEMS, "level": [2 + i % 3 for i in range(12)],
                         "single": [i < 4 for i in range(12)], "per_sample_mean": [0.4] * 12,
                         "majority": [i < 6 for i in range(12)], "weighted": [i < 7 for i in range(12)],
                         "best_of_n": [i < 5 for i in range(12)]})


def steps() -> pd.DataFrame:
    # Right steps score 0.9, wrong ones 0.2 except one wrong first step at 0.95: AUC 1 - 1/(4*3)
    # against every wrong step of "sampled", first-wrong AUC 1 - 1/(4*2).
    rows = [("sampled", 1, 0, 0.9)] * 4 + [("sampled", 0, 1, 0.95), ("sampled", 0, 1, 0.2), ("sampled", 0, 0, 0.2)]
    rows += [("planted", 1, 0, 0.8), ("planted", 0, 1, 0.1)]
    return pd.DataFrame([{"source": s, "path": f"p{i}", "step": 0, "n_steps": 1, "label": y, "first_wrong": f,
                          "score": v} for i, (s, y, f, v) in enumerate(rows)])


def write_record(d, n=8):
    d.mkdir(parents=True)
    requests().to_csv(d / "requests.csv", index=False)
    baselines().to_csv(d / "baselines.csv", index=False)
    steps().to_csv(d / "prm_steps.csv", index=False)
    (d / "bench.json").write_text(json.dumps({"command": "python -m runners.bench_testbed (test)", "n": n, "seed": 0}))


def test_accuracy_vs_beam_has_wilson_intervals():
    acc = T.accuracy_vs_beam(requests())
    row = acc[(acc["policy"] == "ep") & (acc["beam"] == 1)].iloc[0]
    assert (row["correct"], row["n"]) == (5, 12)
    assert row["ci_low"] < 5 / 12 < row["ci_high"] and 0 < row["ci_low"] and row["ci_high"] < 1


def test_paired_differences_find_the_shortcut_cost_and_the_identical_strict_policy():
    pairs = T.paired_differences(requests()).set_index(["beam", "a", "b"])
    shortcut = pairs.loc[(1, "ep", "ep_strict")]
    assert shortcut["diff"] == pytest.approx(-1 / 12) and shortcut["only_b_correct"] == 1
    assert shortcut["diff_ci_low"] < 0
    contract = pairs.loc[(8, "ep_strict", "nonspec")]
    assert contract["diff"] == 0 and contract["only_a_correct"] + contract["only_b_correct"] == 0


def test_methods_put_search_beside_the_baselines_on_the_same_problems():
    m = T.methods_at_n(requests(), baselines(), 8).set_index("method")
    assert m.loc["majority vote", "accuracy"] == pytest.approx(0.5)
    assert m.loc["PRM beam search (nonspec, beam 8)", "accuracy"] == pytest.approx(8 / 12)
    assert m.loc["single sample", "beam_minus_method"] == pytest.approx(8 / 12 - 4 / 12)


def test_goodput_counts_only_answers_within_the_budget():
    gp = T.goodput(requests(), [0.35]).set_index(["policy", "beam"])
    # nonspec beam 1: problems 0 and 2 are correct within 0.35 s (latencies 0.1, 0.3), makespan 1.2 s.
    assert gp.loc[("nonspec", 1), "correct_per_s"] == pytest.approx(2 / 1.2)
    assert gp.loc[("nonspec", 8), "correct_per_s"] == 0


def test_prm_auc_and_calibration():
    auc = T.prm_auc(steps()).set_index("source")
    assert auc.loc["sampled", "auc_all_wrong"] == pytest.approx(1 - 4 / 12)
    assert auc.loc["sampled", "auc_first_wrong"] == pytest.approx(1 - 4 / 8)
    assert auc.loc["planted", "auc_first_wrong"] == 1.0
    rng = np.random.default_rng(0)
    p = rng.uniform(size=4000)
    calibrated = pd.DataFrame({"source": "x", "score": p, "label": (rng.uniform(size=4000) < p).astype(int)})
    assert T.calibration(calibrated)["ece"].iloc[0] < 0.05
    overconfident = calibrated.assign(score=np.where(calibrated["score"] > 0.5, 0.99, 0.01))
    assert T.calibration(overconfident)["ece"].iloc[0] > 0.2


def test_section_draws_tables_and_figures_from_the_record(tmp_path):
    write_record(tmp_path / "res" / "testbed")
    pd.DataFrame([{"policy": "nonspec", "beam": 1, "n": 12, "accuracy": 0.5, "ci_low": 0.25, "ci_high": 0.75,
                   "sim_n": 100, "sim_accuracy": 0.9, "sim_ci_low": 0.8, "sim_ci_high": 0.95,
                   "within_measured_ci": False}]).to_csv(tmp_path / "res" / "testbed" / "sim_vs_measured.csv")
    sec = testbed.build_section(tmp_path / "res", tmp_path / "out")
    names = {p.name for p in sec.figures}
    assert {"testbed_accuracy_vs_beam.png", "testbed_methods.png", "testbed_goodput.png",
            "testbed_prm_reliability.png"} <= names
    captions = " ".join(c for c, _, _ in sec.tables)
    for what in ("Accuracy vs beam", "Paired differences", "Search vs sampling baselines", "per second",
                 "step AUC", "reliability", "sim with the fitted testbed workload"):
        assert what in captions, what
    assert sec.missing == []
    assert any("0/1 predictions inside" in n and "MISSES: nonspec beam 1" in n for n in sec.notes)
    assert any("0 discordant" in n for n in sec.notes)


def test_no_record_is_a_line_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(testbed, "COMMITTED", tmp_path / "none")
    sec = testbed.build_section(tmp_path, tmp_path / "out")
    assert not sec.drawn
    assert len(sec.missing) == 1 and "python -m runners.bench_testbed" in sec.missing[0]
    write_record(tmp_path / "testbed")
    sec = testbed.build_section(tmp_path, tmp_path / "out")
    assert sec.drawn and any("runners.fit_testbed_workload" in m for m in sec.missing)


def test_the_committed_record_is_read_when_the_results_dir_has_none(tmp_path):
    if testbed.record_dir(None) is None:
        pytest.skip("no committed testbed record in this checkout")
    sec = testbed.build_section(tmp_path, tmp_path / "out")
    assert sec.drawn and any("results/testbed (committed)" in n for n in sec.notes)
