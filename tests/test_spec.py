"""The cell's config is read once: the entry validates it into a frozen CellSpec and every
layer below (store and hash, W&B, provenance, builders, Server) reads that spec."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cfg_helpers import compose_cfg, compose_spec
from specscale import cell as cell_module
from specscale.settings.search_policy import PolicyConfig, SearchConfig
from specscale.data import loader
from specscale.settings import dataset as data_spec
from specscale.results import store
from specscale.cell_job import run_and_store
from specscale.settings import CellSpec


@pytest.fixture
def parses(monkeypatch):
    """Counts every parse of a config into a spec or one of its parts."""
    counts = {"cell": 0, "dataset": 0, "search": 0, "policy": 0}

    def counting(name, owner, attr):
        real = getattr(owner, attr)
        func = getattr(real, "__func__", real)

        def wrapped(*args, **kwargs):
            counts[name] += 1
            return func(*args, **kwargs)

        monkeypatch.setattr(owner, attr, classmethod(wrapped) if hasattr(real, "__func__") else wrapped)

    counting("cell", CellSpec, "from_config")
    counting("search", SearchConfig, "from_config")
    counting("policy", PolicyConfig, "from_config")
    # The dataset part is parsed by specscale.settings.cell_settings (imported name) and by the loader.
    import specscale.settings.cell_settings as spec_cell

    real = data_spec.spec_from_config

    def dataset(cfg):
        counts["dataset"] += 1
        return real(cfg)

    monkeypatch.setattr(spec_cell, "spec_from_config", dataset)
    monkeypatch.setattr(loader, "spec_from_config", dataset)
    return counts


def test_one_cell_run_validates_its_config_once(tmp_path, parses):
    result = run_and_store(compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled"))
    assert result["status"] == "done"
    assert parses == {"cell": 1, "dataset": 1, "search": 1, "policy": 1}
    # The files written from the spec are the config the entry was given.
    written = json.loads((Path(result["cell_dir"]) / "config.json").read_text())
    assert written == compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled")


def test_layers_below_the_entry_take_the_spec_and_never_reparse(tmp_path, parses):
    spec = compose_spec(f"results_dir={tmp_path}", "wandb.mode=disabled", "dataset=fixture_gsm8k")
    before = dict(parses)
    out = store.cell_dir(spec)
    assert out.name.endswith(store.config_hash(spec)) and out.parts[-4:-1] == ("fixture_gsm8k", "qwen2.5-7b", "full")
    backend, problems = cell_module.build_backend(spec)  # the builders take the spec
    assert len(problems) == spec.n_problems == 4
    server = cell_module.build_server(spec, built=(backend, problems))
    assert server.search_cfg is spec.search and server.policy is spec.policy
    summary = cell_module.run_cell(spec, tmp_path / "cell")
    assert summary["provenance"]["dataset"]["source_fingerprint"] == spec.provenance.source_fingerprint
    assert parses == before, "a layer below the entry parsed the config again"


def test_the_spec_is_frozen_all_the_way_down():
    cfg = compose_cfg("dataset=fixture_gsm8k")
    spec = CellSpec.from_config(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.config["engine"]["kv_blocks"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.config["metrics"]["latency_budgets_s"].append(1)
    cfg["engine"]["kv_blocks"] = 1  # the caller's dict is not the spec's
    assert spec.config["engine"]["kv_blocks"] is None
    # What the hash reads is the config as given: the spec keeps cell hashes stable.
    assert spec.resolved() == compose_cfg("dataset=fixture_gsm8k")


def test_the_spec_carries_dataset_provenance_and_tracking_parts():
    spec = compose_spec("dataset=fixture_gsm8k", "wandb.mode=offline", "experiment_name=x", "results_dir=/r")
    assert isinstance(spec.dataset, data_spec.DatasetSpec) and spec.dataset.name == "fixture_gsm8k"
    assert len(spec.provenance.source_fingerprint) == 16
    assert spec.tracking.mode == "offline" and (spec.store.results_dir, spec.store.experiment) == ("/r", "x")
    assert spec.model.name == "qwen2.5-7b" and spec.hardware == "A100-SXM4-80GB"
    hub = compose_spec("dataset=gsm8k")
    assert hub.provenance.source_fingerprint is None and hub.dataset.hub_name == "openai/gsm8k"
