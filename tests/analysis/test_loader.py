"""The loader: index.parquet where present, a scan for summary.json elsewhere, failed
cells reported, per-cell tables read or reported missing."""
from __future__ import annotations

import json
import shutil

import pandas as pd

from analysis.loader import failed_cells, load_index, ok_cells, read_cell_table, read_cell_tables


def test_scan_and_index_together_find_every_cell(sweep_dir):
    idx = load_index(sweep_dir)
    assert len(ok_cells(idx)) == 27 + 4  # the sweep's cells and the search family's (conftest.write_search_family)
    failed = failed_cells(idx)
    assert len(failed) == 1 and failed["policy"].iloc[0] == "spec" and failed["beam"].iloc[0] == 16
    assert "KV leak" in failed["error"].iloc[0]
    # The serving subtree and the search family's store carry an index and are read through
    # it; the rest is scanned.
    indexed = idx["cell_dir"].str.contains("/serving/|/search_family/")
    assert indexed.sum() == 4 + 4 and set(idx.loc[indexed, "source"]) == {"index"}
    assert set(idx.loc[~indexed, "source"]) == {"scan"}
    # Nested summary values become scalar columns, whichever way the row was read.
    assert {"prm_triggers_barrier", "prm_triggers_immediate"} <= set(idx.columns)
    assert (idx.loc[idx["policy"] == "nonspec", "prm_triggers_barrier"] > 0).all()


def test_index_is_the_source_of_truth_and_late_cells_are_added(tmp_path, small_cell, index_writer):
    root = tmp_path / "exp"
    small_cell(root / "a", "policy=nonspec", "beam=4", "seed=3")
    index = index_writer(root)
    # A marker only the index holds shows the index was used rather than summary.json.
    index["experiment"] = "from-index"
    index["throughput_tok_s"] = -1.0
    failed = {"status": "failed", "cell_dir": "gone", "error": "boom", "experiment": "from-index"}
    pd.concat([index, pd.DataFrame([failed])]).to_parquet(root / "index.parquet", index=False)
    small_cell(root / "b", "policy=full", "beam=4", "seed=3")  # finished after the index was written
    idx = load_index(tmp_path)
    a = idx[idx["cell_dir"].str.endswith("/a")].iloc[0]
    assert a["throughput_tok_s"] == -1.0 and a["experiment"] == "from-index" and a["source"] == "index"
    b = idx[idx["cell_dir"].str.endswith("/b")].iloc[0]
    assert b["source"] == "scan" and b["throughput_tok_s"] > 0
    assert list(failed_cells(idx)["error"]) == ["boom"]
    assert str(a["cell_dir"]).startswith(str(root.resolve()))


def test_directories_without_cells_and_unreadable_files(tmp_path, sweep_dir):
    assert len(load_index(tmp_path / "nowhere")) == 0
    (tmp_path / "empty" / "deep").mkdir(parents=True)
    idx = load_index(tmp_path / "empty")
    assert len(idx) == 0 and {"cell_dir", "status"} <= set(idx.columns)
    # A truncated summary is not a cell; a missing table reads as None.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    assert len(ok_cells(load_index(tmp_path / "bad"))) == 0
    assert read_cell_table(bad, "requests") is None
    (bad / "requests.parquet").write_bytes(b"garbage")
    assert read_cell_table(bad, "requests") is None


def test_cell_tables_are_read_and_tagged_with_the_cell(sweep_dir, tmp_path):
    cells = ok_cells(load_index(sweep_dir)).head(3)
    vb = read_cell_tables(cells, "verify_batches")
    assert set(vb["cell"]) == set(cells.index)
    req = read_cell_table(cells["cell_dir"].iloc[0], "requests")
    assert {"problem_id", "latency_s", "correct"} <= set(req.columns)
    # A cell whose directory lost its files is skipped, not fatal.
    copy = tmp_path / "copy"
    shutil.copytree(cells["cell_dir"].iloc[0], copy)
    (copy / "verify_batches.parquet").unlink()
    assert read_cell_table(copy, "verify_batches") is None
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["policy"] == cells["policy"].iloc[0]


def test_cells_from_before_a_summary_field_read_as_its_value_then(tmp_path, small_cell):
    """A cell written before summaries named the search (or the ablation) is beam search
    without ablation: it stays in one context with a new cell of the same setting."""
    assert small_cell(tmp_path / "new", "policy=nonspec", "beam=4", "seed=3")["search"] == "beam"
    small_cell(tmp_path / "old", "policy=full", "beam=4", "seed=3")
    old = tmp_path / "old"
    summary = json.loads((old / "summary.json").read_text())
    del summary["search"], summary["ablation"]
    (old / "summary.json").write_text(json.dumps(summary))
    idx = ok_cells(load_index(tmp_path))
    assert len(idx) == 2 and set(idx["search"]) == {"beam"} and set(idx["ablation"]) == {"none"}
