"""When data cannot be loaded the error says so and names the local override."""

import datasets.config
import huggingface_hub.constants
import pytest

from specscale.data import DatasetUnavailableError, load_problems


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.parametrize("name", ["gsm8k", "math500", "olympiadbench"])
def test_offline_and_not_cached_names_the_override(offline, dataset_cfg, name):
    # The private, empty cache_dir guarantees the hub dataset is not cached.
    flags_before = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    with pytest.raises(DatasetUnavailableError) as info:
        load_problems(dataset_cfg(name))
    message = str(info.value)
    assert "dataset.data_files=" in message
    assert "dataset.data_dir=" in message
    assert "offline" in message
    assert f"fixture_{name}" in message
    # the library flags raised for the call are restored afterwards
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == flags_before


def test_unknown_hub_name_offline(offline, dataset_cfg):
    with pytest.raises(DatasetUnavailableError, match="dataset.data_files="):
        load_problems(dataset_cfg("math500", hub_name="specscale-tests/never-published"))


def test_missing_local_file_names_the_override(dataset_cfg, tmp_path):
    with pytest.raises(DatasetUnavailableError, match="dataset.data_files"):
        load_problems(dataset_cfg("fixture_gsm8k", data_files=str(tmp_path / "absent.jsonl")))


def test_missing_data_dir(dataset_cfg, tmp_path):
    with pytest.raises(DatasetUnavailableError, match="data_dir"):
        load_problems(dataset_cfg("gsm8k", data_dir=str(tmp_path / "nope")))
