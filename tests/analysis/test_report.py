"""The report command: every section listed, missing cells as clear lines, never an
exception for missing data."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from analysis import cells as C
from analysis import table_latency
from analysis.loader import load_index
from analysis.output import Section
from analysis.report import main, make_report, run_sections

REPO = Path(__file__).resolve().parents[2]
SECTION_TITLES = ("Fig. 13", "Throughput reading", "Fig. 15", "Fig. 16",
                  "Adaptive verification vs fixed B_max (beyond the paper)", "Serving curves", "Concurrency sweep",
                  "Beam scaling", "Occupancy: rows and KV over time", "Mechanism ablation",
                  "Table 2", "Raw latency percentiles", "Shortcut divergence", "Waste", "Physical/logical ratio",
                  "PRM batch-size distribution", "Validation (held-out paper numbers)",
                  "Sensitivity and engine efficiency", "Fidelity (sim on a measured profile vs the engine)",
                  "Testbed (CPU, trained pair: model=testbed, dataset=arith)", "Search family")


def test_cli_on_a_single_nonspec_cell_says_what_is_missing(tmp_path, small_cell):
    small_cell(tmp_path / "results" / "only", "policy=nonspec", "beam=4", "seed=0")
    proc = subprocess.run([sys.executable, "-m", "analysis.report", str(tmp_path / "results")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "results" / "report" / "report.md"
    text = report.read_text()
    for title in SECTION_TITLES:
        assert f"## {title}" in text
    for line in ("Fig. 16: no saturated cells of policy full",
                 "Serving curves: no canonical cells with workload poisson",
                 "Concurrency sweep: no policy has saturated cells at more than one concurrency",
                 "Beam scaling: no policy has saturated cells at more than one beam size",
                 "Shortcut divergence: no ep_strict cells",
                 "Paired comparisons: no two policies share a context and seed",
                 "Fig. 13: no saturated canonical cells of spec, fasttts, ep, ep_cd, full"):
        assert line in text, line
    assert "analysis error" not in text
    # What one cell allows is still drawn: its throughput bar, accuracy, latency, PRM batches.
    assert (tmp_path / "results" / "report" / "figures" / "fig13_throughput.png").is_file()
    assert (tmp_path / "results" / "report" / "tables" / "table2_accuracy.csv").is_file()


def test_empty_and_failed_only_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    text = make_report(tmp_path / "empty").read_text()
    assert "No completed cells." in text and "Fig. 13: no saturated canonical cells" in text
    failed = tmp_path / "failed" / "cell"
    failed.mkdir(parents=True)
    (failed / "error.json").write_text(json.dumps({"status": "failed", "error": "out of memory\ntrace"}))
    text = make_report(tmp_path / "failed", tmp_path / "out").read_text()
    assert "## Failed or incomplete cells" in text and "out of memory" in text and "trace" not in text
    assert "analysis error" not in text


def test_cells_with_missing_tables_do_not_break_the_report(tmp_path, small_cell):
    for pol in ("nonspec", "ep", "ep_strict"):
        small_cell(tmp_path / "r" / pol, f"policy={pol}", "beam=4", "seed=0")
    for name in ("requests", "rounds", "verify_batches", "iterations"):
        (tmp_path / "r" / "ep" / f"{name}.parquet").unlink()
    text = make_report(tmp_path / "r").read_text()
    assert "analysis error" not in text
    assert "## Fig. 13" in text


def test_an_unexpected_error_in_one_section_is_reported_and_the_rest_go_on(tmp_path, monkeypatch):
    from analysis import fig_waste

    def broken(cells, out):
        raise KeyError("boom")

    monkeypatch.setattr(fig_waste, "build", broken)
    secs = run_sections(pd.DataFrame({"policy": [], "status": []}), pd.DataFrame(), tmp_path)
    assert all(isinstance(s, Section) for s in secs) and len(secs) == len(SECTION_TITLES)
    assert any("Waste: analysis error KeyError" in m for s in secs for m in s.missing)


def test_main_rejects_a_missing_directory(tmp_path, capsys):
    assert main([str(tmp_path / "absent")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_sweep_report_lists_every_section_and_the_failed_cell(sweep_report):
    text = sweep_report[0].read_text()
    for title in SECTION_TITLES:
        assert f"## {title}" in text
    assert "ablation/spec/b16-c4-s1" in text and "KV leak" in text
    assert "## Not drawn\n\nEvery figure and table was drawn." in text


def test_budgets_given_are_the_budgets_reported(sweep_dir):
    cells = C.prepare(load_index(sweep_dir))
    t = table_latency.latency_table(cells, [1.0, 2.0])
    assert {"correct_per_s_at_1s", "correct_per_s_at_2s"} <= set(t.columns)
    assert not any("at_30s" in c for c in t.columns)
    # The harness's budgets (30..300 s) exceed every simulated latency: extra budgets are added.
    chosen, note = table_latency.informative_budgets(C.canonical(cells), [30.0, 60.0])
    assert len(chosen) > 2 and max(chosen) == 60.0 and "Every request met every budget" in note


def test_sweep_report_shows_the_validation_table(sweep_report):
    text = sweep_report[0].read_text()
    assert "Fig. 13 qwen2.5-7b beam 8: ep output tok/s" in text and "validation_scatter.png" in text
    assert "fig13/qwen2.5-7b/b8/ep_cd/output_tok_s" in text  # the stable id beside each target
    assert "numeric held-out targets within their tolerance" in text
    assert "Not validated: table2" in text
    assert "sealed looks under protocol v" in text


def test_sweep_report_shows_the_engine_efficiency_study(sweep_report):
    text = sweep_report[0].read_text()
    assert "sensitivity_overhead.png" in text and "calibrated and roofline profiles" in text
