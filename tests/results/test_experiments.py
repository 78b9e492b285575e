"""Each +experiment= config composes and enumerates the cells the paper describes."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from specscale.results.experiments import CONF_DIR, cells, distinct_cells, names

EXPECTED = {  # jobs of `python run.py -m +experiment=NAME`
    "fig13_ablation": 6 * 2 * 4 * 3,  # policies x beams x model pairs x datasets
    "fig15_breakdown": 5,
    "fig16_lv_threshold": 2 * 5 * 2,  # {ep_cd, full} x B_max 256..4096 x beams
    "serving_curves": 4 * 6 * 2,
    "concurrency_sweep": 3 * 4 * 2,
    "beam_scaling": 2 * 4,
    "table2_accuracy": 4 * 3 * 2 * 3,
    "controls": 4 * 2 * 3,
    "adaptive_eval": 3 * 4 * 2 * 4 * 3 * 3,  # {ep_cd, full, adaptive} x B_max x beams x pairs x datasets x seeds
    "adaptive_serving": 3 * 4 * 3 * 2 * 3,  # {ep_cd, full, adaptive} x B_max x rates x beams x seeds
    "adaptive_concurrency": 3 * 4 * 4 * 2 * 3,  # {ep_cd, full, adaptive} x B_max x concurrencies x beams x seeds
    "shortcut_length": 4 * 3 * 3,  # {nonspec, ep_strict, ep, full} x exact-1.0 shares x seeds
    "mechanism_ablation": 8 * 5 * 3,  # ablations x policies x seeds
    "mechanism_ablation_fig16": 8 * 2 * 5 * 3,  # ablations x {ep_cd, full} x B_max x seeds
    # engines x (searches x N under nonspec + searches x policies at N = 16, nonspec at 16 once);
    # the sweep leaves out the 20 refused search x policy jobs (84 cells)
    "search_family": 2 * (4 * 7 + 4 * 7 - 4),
}


def test_every_experiment_is_counted():
    assert set(names()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_composes_and_enumerates(name):
    jobs = cells(name)
    assert len(jobs) == EXPECTED[name]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"+experiment={name}", *jobs[-1]])
    assert cfg.experiment_name == name
    assert cfg.expansion == 4 and cfg.search.max_rounds == 40 and cfg.search.temperature == 0.8


def test_paper_specifics():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        fig15 = compose("config", ["+experiment=fig15_breakdown"])
        serving = compose("config", ["+experiment=serving_curves"])
    assert fig15.model.name == "qwen2.5-7b" and fig15.beam == 4
    assert serving.workload.kind == "poisson"
    assert {j[2] for j in cells("fig16_lv_threshold")} == {f"policy.b_max={b}" for b in (256, 512, 1024, 2048, 4096)}
    assert len(distinct_cells("fig16_lv_threshold")) == 12  # ep_cd ignores B_max: one cell per beam
    assert len(cells("fig13_ablation", ["model=qwen2.5-7b", "dataset=math500"])) == 12
    assert len(distinct_cells("adaptive_eval")) == (1 + 4 + 1) * 2 * 4 * 3 * 3  # one ep_cd / adaptive cell per B_max sweep


def test_listing_prints_every_experiment_with_its_job_count(capsys):
    from specscale.results.experiments import main

    main([])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert {r[0]: int(r[1]) for r in rows} == EXPECTED and all(r[2:] == ["jobs"] for r in rows)


def test_listing_counts_distinct_cells_on_request(capsys):
    from specscale.results.experiments import main

    main(["fig16_lv_threshold", "--distinct", "--cells"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["fig16_lv_threshold", "20", "jobs", "12", "distinct", "cells"]
    assert len(lines) == 1 + 20 and all("policy.b_max=" in line for line in lines[1:])
