"""engine=torch fails before anything runs, with errors that name the setting and the file:
missing / corrupt / uncached checkpoints, unknown architectures and formats, prompts
longer than the generator's context window."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from cfg_helpers import compose_spec
from specscale.settings.search_policy import ConfigError
from specscale.engine.torch.build import build_torch
from specscale.testbed.tiny_models import ensure_tiny_models

BASE = ["engine=torch", "model=tiny", "dataset=fixture_math500", "n_problems=2", "progress=false"]


def spec(*overrides):
    return compose_spec(*BASE, *overrides, small=False)


@pytest.fixture
def copy_of(tmp_path):
    paths = ensure_tiny_models()

    def make(name, edit=None):
        dst = tmp_path / f"{name}-copy"
        shutil.copytree(paths[name], dst)
        if edit is not None:
            conf = json.loads((dst / "config.json").read_text())
            edit(conf)
            (dst / "config.json").write_text(json.dumps(conf))
        return dst

    return make


def test_builds_the_tiny_pair():
    backend, problems = build_torch(spec("engine.kv_blocks=64"))
    assert len(problems) == 2 and backend.kv_blocks(16) == 64
    assert backend.runner.dtype == torch.float32  # model.dtype of the tiny pair
    assert backend.prm.max_model_len == 4096  # model.prm_max_len
    assert backend.delimiter_ids and backend.eos_ids


def test_missing_checkpoint_directory(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=r"model.generator.hf_name=.*checkpoint directory not found"):
        build_torch(spec(f"model.generator.hf_name={missing}"))
    with pytest.raises(FileNotFoundError, match=r"model.prm.hf_name=.*checkpoint directory not found"):
        build_torch(spec(f"model.prm.hf_name={missing}"))


def test_hub_model_not_in_the_local_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match=r"'specscale-test/not-a-model'.*not in the local Hugging Face cache"):
        build_torch(spec("model.generator.hf_name=specscale-test/not-a-model"))


def test_unknown_tiny_model_and_format():
    with pytest.raises(ConfigError, match="no such tiny model"):
        build_torch(spec("model.generator.hf_name=tiny/gpt2"))
    with pytest.raises(ConfigError, match="model.prm.format='math_shepherd': unknown PRM format"):
        build_torch(spec("model.prm.format=math_shepherd"))


def test_corrupt_checkpoint(copy_of):
    d = copy_of("qwen2")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"model.generator \(.*qwen2-copy\): corrupt or unreadable safetensors"):
        build_torch(spec(f"model.generator.hf_name={d}"))


def test_corrupt_config_json(copy_of):
    d = copy_of("qwen2_prm")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"model.prm \(.*\): .*config.json is not valid JSON"):
        build_torch(spec(f"model.prm.hf_name={d}"))


def test_unknown_architecture(copy_of):
    d = copy_of("qwen2", lambda c: c.update(architectures=["MambaForCausalLM"]))
    with pytest.raises(ValueError, match=r"model.generator \(.*\): .*unknown architecture 'MambaForCausalLM'"):
        build_torch(spec(f"model.generator.hf_name={d}"))


def test_checkpoints_in_the_wrong_role():
    with pytest.raises(ValueError, match="not a generator"):
        build_torch(spec("model.generator.hf_name=tiny/qwen2_prm"))
    with pytest.raises(ValueError, match="does not fit architecture"):
        build_torch(spec("model.prm.format=rlhflow_llama_prm"))


def test_prompt_longer_than_the_context_window(copy_of):
    d = copy_of("qwen2", lambda c: c.update(max_position_embeddings=300))  # fixture prompts: ~450+ tokens
    with pytest.raises(ValueError, match=r"prompt has \d+ tokens.*context window \(max_position_embeddings=300"):
        build_torch(spec(f"model.generator.hf_name={d}"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_requested_without_cuda():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        build_torch(spec("engine.device=cuda"))
