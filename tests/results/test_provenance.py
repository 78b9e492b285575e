"""Provenance in every summary; the cell hash follows the data and the results version."""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from cfg_helpers import compose_cfg, compose_spec
from specscale.data.loader import load_problems
from specscale.data.source import PACKAGE_DIR, load_arguments
from specscale.settings.dataset import spec_from_config
from specscale import version
from specscale.results import store
from specscale.results.provenance import rows_fingerprint
from specscale.cell_job import run_and_store


def test_summary_records_code_versions_host_device_and_data(tmp_path):
    result = run_and_store(compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled", "dataset=fixture_gsm8k"))
    prov = json.loads((Path(result["cell_dir"]) / "summary.json").read_text())["provenance"]
    assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
    assert {"python", "torch", "cuda", "transformers", "flashinfer-python", "datasets", "math-verify",
            "specscale"} <= set(prov["versions"])
    assert prov["versions"]["torch"] and prov["versions"]["specscale"]
    assert prov["host"] == socket.gethostname()
    # engine=sim computes on the host CPU: the device says so (hardware names the modelled GPU).
    assert prov["device"]["type"] == "cpu" and prov["device"]["name"]
    assert prov["attention"] is None  # the sim runs no attention kernels
    ds = prov["dataset"]
    assert ds["name"] == "fixture_gsm8k" and ds["revision"] is None and ds["rows"] == 4
    assert len(ds["source_fingerprint"]) == 16 and len(ds["rows_fingerprint"]) == 16
    assert prov["results_version"] == version.RESULTS_VERSION


def test_hash_changes_when_the_data_file_changes(tmp_path):
    data = tmp_path / "test.jsonl"
    shutil.copy(PACKAGE_DIR / "fixtures" / "gsm8k.jsonl", data)
    overrides = ("dataset=fixture_gsm8k", f"dataset.data_files={data}")
    before = store.config_hash(compose_spec(*overrides))
    assert store.config_hash(compose_spec(*overrides)) == before
    rows = data.read_text().splitlines()
    row = json.loads(rows[0])
    row["answer"] = row["answer"] + "0"  # a corrected reference answer, same path
    data.write_text("\n".join([json.dumps(row), *rows[1:]]) + "\n")
    # The spec fingerprints the data when it is built (at the entry, before the cell runs).
    changed = compose_spec(*overrides)
    assert store.config_hash(changed) != before
    assert changed.provenance.source_fingerprint != compose_spec("dataset=fixture_gsm8k").provenance.source_fingerprint
    assert store.cell_dir(changed) != store.cell_dir(compose_spec("dataset=fixture_gsm8k"))


def test_hash_covers_the_results_version(monkeypatch):
    before = store.config_hash(compose_spec())
    monkeypatch.setattr(version, "RESULTS_VERSION", version.RESULTS_VERSION + 1)
    assert store.config_hash(compose_spec()) != before


def test_rows_fingerprint_follows_the_rows_used():
    ds = compose_cfg("dataset=fixture_gsm8k")["dataset"]
    a, b = load_problems(ds, n_problems=3), load_problems(ds, n_problems=4)
    assert rows_fingerprint(a) == rows_fingerprint(load_problems(ds, n_problems=3))
    assert rows_fingerprint(a) != rows_fingerprint(b)


def test_dataset_revision_reaches_load_dataset():
    ds = compose_cfg("dataset=gsm8k", "dataset.revision=abc123")["dataset"]
    path, kwargs = load_arguments(spec_from_config(ds))
    assert path == "openai/gsm8k" and kwargs["revision"] == "abc123"
