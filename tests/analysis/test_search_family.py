"""The search-family section on real cells: the testbed on the torch engine (measured)
and on the sim (predicted), two searches, two policies, two budgets."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import cells as C
from analysis import search_family as SF
from analysis.loader import load_index
from analysis.stats import t_interval, wilson_interval
from specscale.cell_job import run_and_store
from specscale.compose import compose_config

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["+experiment=search_family", "n_problems=6", "concurrency=3", "search.max_rounds=8", "seed=0",
          "wandb.mode=disabled", "progress=false", "hardware=profiled/cpu-tiny"]
JOBS = [("beam", "nonspec", 1), ("beam", "nonspec", 4), ("best_of_n", "nonspec", 1), ("best_of_n", "nonspec", 4),
        ("beam", "ep", 4)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("search_family")
    for engine in ("torch", "sim"):
        for search, policy, beam in JOBS:
            cfg = compose_config([*COMMON, f"results_dir={root}", f"engine={engine}", f"search={search}",
                                  f"policy={policy}", f"beam={beam}",
                                  *(["engine.probe_check=false"] if engine == "sim" else [])])  # fmt: skip
            assert run_and_store(cfg)["status"] == "done"
    return root


@pytest.fixture(scope="module")
def cells(store):
    return SF.family_cells(C.prepare(load_index(store)))


def test_scaling_reads_accuracy_per_level_from_the_requests(cells):
    table = SF.scaling_table(cells)
    torch_rows = table[table["engine"] == "torch"]
    # the torch engine serves the arith split, whose rows carry a level; the sim's problems have none
    assert set(table[table["engine"] == "sim"]["level"]) == {SF.ALL}
    assert set(torch_rows["level"]) - {SF.ALL}
    for row in torch_rows.itertuples():
        assert row.ci_low <= row.accuracy <= row.ci_high
    every = torch_rows[torch_rows["level"] == SF.ALL]
    assert sorted(every["n"]) == [6] * 4  # beam and best_of_n at N = 1 and 4
    by_level = torch_rows[torch_rows["level"] != SF.ALL].groupby(["search", "N"])["n"].sum()
    assert (by_level == 6).all()  # the levels partition the problems
    summary = cells[(cells["engine"] == "torch") & (cells["policy"] == "nonspec")].set_index(["search", "beam"])
    for row in every.itertuples():
        assert row.accuracy == pytest.approx(summary.loc[(row.search, row.N), "accuracy"])
        assert row.tokens_per_problem == pytest.approx(summary.loc[(row.search, row.N), "decoded_tokens"] / 6)


def test_policy_speedups_pair_each_policy_with_nonspec_of_its_search_and_budget(cells):
    table = SF.policy_table(cells, budgets_s=(1e-9, 1e9))
    assert set(zip(table["search"], table["N"])) == {("beam", 4)}  # the only budget where two policies ran
    for engine in ("torch", "sim"):
        mine = cells[(cells["engine"] == engine) & (cells["search"] == "beam") & (cells["beam"] == 4)].set_index("policy")
        row = table[(table["engine"] == engine) & (table["policy"] == "ep")].iloc[0]
        assert row["speedup_vs_nonspec"] == pytest.approx(mine.loc["nonspec", "makespan_s"] / mine.loc["ep", "makespan_s"])
        # no request is answered within a nanosecond; with an unbounded budget, every correct one counts
        assert row["correct_per_s_within_1e-09s"] == 0.0
        correct = mine.loc["ep", "accuracy"] * 6
        assert row["correct_per_s_within_1e+09s"] == pytest.approx(correct / mine.loc["ep", "makespan_s"])
        assert row["physical_logical_ratio"] == pytest.approx(mine.loc["ep", "physical_logical_ratio"])
        assert (row["accuracy_ci_low"], row["accuracy_ci_high"]) == pytest.approx(wilson_interval(round(correct), 6))
        assert row["seeds"] == 1 and np.isnan(row["speedup_ci_low"])  # one seed: no interval over seeds
    pvm = SF.predicted_vs_measured(table)
    assert list(pvm["policy"]) == ["ep"]
    r = pvm.iloc[0]
    assert r["speedup_error"] == pytest.approx(r["predicted_speedup"] / r["measured_speedup"] - 1)
    for engine, col in (("torch", "measured_physical_logical"), ("sim", "predicted_physical_logical")):
        ep = cells[(cells["engine"] == engine) & (cells["search"] == "beam") & (cells["beam"] == 4)
                   & (cells["policy"] == "ep")]  # fmt: skip
        assert r[col] == pytest.approx(ep["physical_logical_ratio"].mean())


def test_policy_speedup_interval_is_over_the_seeds_paired_ratios():
    # two seeds: nonspec 10 s and 12 s, ep 5 s and 4 s -> ratios 2 and 3 (mean 2.5)
    df = pd.DataFrame({"engine": "torch", "search": "beam", "beam": 4, "policy": ["nonspec", "nonspec", "ep", "ep"],
                       "seed": [0, 1, 0, 1], "makespan_s": [10.0, 12.0, 5.0, 4.0], "accuracy": [0.5, 0.5, 0.5, 0.75],
                       "physical_logical_ratio": 1.0}, index=["n0", "n1", "e0", "e1"])
    req = pd.DataFrame({"cell": ["n0", "n0", "n1", "n1", "e0", "e0", "e1", "e1"], "correct": [1, 0, 1, 0, 1, 0, 1, 1],
                        "admit_s": 0.0, "finish_s": 1.0})
    table = SF.policy_table(df, budgets_s=(2.0,), req=req)
    row = table.set_index("policy").loc["ep"]
    assert row["seeds"] == 2 and row["speedup_vs_nonspec"] == pytest.approx(2.5)
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == pytest.approx(t_interval([2.0, 3.0]))
    assert (row["accuracy_ci_low"], row["accuracy_ci_high"]) == pytest.approx(wilson_interval(3, 4))
    # the predicted table carries the measured interval beside the sim's speed-up
    pvm = SF.predicted_vs_measured(pd.concat([table, table.assign(engine="sim")], ignore_index=True)).iloc[0]
    assert (pvm["measured_ci_low"], pvm["measured_ci_high"]) == pytest.approx(t_interval([2.0, 3.0]))


def test_winners_need_a_lower_bound_above_the_runner_up():
    scaling = pd.DataFrame([
        {"engine": "torch", "search": "beam", "N": 8, "level": "1", "accuracy": 0.9, "ci_low": 0.8, "ci_high": 0.95},
        {"engine": "torch", "search": "dvts", "N": 8, "level": "1", "accuracy": 0.6, "ci_low": 0.5, "ci_high": 0.7},
        {"engine": "torch", "search": "beam", "N": 8, "level": "2", "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6},
        {"engine": "torch", "search": "dvts", "N": 8, "level": "2", "accuracy": 0.45, "ci_low": 0.35, "ci_high": 0.55},
        {"engine": "sim", "search": "dvts", "N": 8, "level": "2", "accuracy": 0.99, "ci_low": 0.98, "ci_high": 1.0},
    ])
    win = SF.winners(scaling).set_index("level")
    assert win.loc["1", "best"] == "beam" and bool(win.loc["1", "clear"])
    assert win.loc["2", "best"] == "beam" and not bool(win.loc["2", "clear"])  # the sim's row is a prediction


def test_section_writes_its_figures_and_tables(cells, tmp_path):
    sec = SF.build(cells, tmp_path)
    assert [p.name for p in sec.figures] == ["search_family_scaling.png", "search_family_policies.png"]
    assert {csv.name for _, csv, _ in sec.tables} == {"search_family_scaling.csv", "search_family_winners.csv",
                                                       "search_family_policies.csv", "search_family_predicted.csv"}
    assert any(n.startswith("Sim speed-ups within 10% of the measured ones: ") for n in sec.notes)
    assert not sec.missing


def test_section_says_what_to_run_without_cells(tmp_path):
    sec = SF.build(pd.DataFrame(), tmp_path)
    assert not sec.drawn and "python run.py -m +experiment=search_family" in sec.missing[0]
