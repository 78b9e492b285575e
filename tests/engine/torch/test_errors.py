"""Bad inputs fail early with errors that name the problem."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.model.loader import load_model
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.tokenizer import load_tokenizer


@pytest.fixture
def copy_of(tiny, tmp_path):
    def make(name):
        dst = tmp_path / name
        shutil.copytree(tiny[name], dst)
        return dst

    return make


@pytest.fixture(scope="module")
def runner(tiny):
    return ModelRunner(tiny["qwen2"], dtype=torch.float32, num_blocks=80, block_size=16)


def test_missing_checkpoint_dir(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found.*no-such-model"):
        ModelRunner(missing)
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        ProcessRewardModel(missing)
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        load_tokenizer(missing)


def test_missing_config_and_weights(copy_of):
    d = copy_of("qwen2")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(d)
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(d)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(copy_of, damage):
    d = copy_of("qwen2")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(b"\x00garbage, not a safetensors header" * 3 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or unreadable safetensors file .*model.safetensors"):
        ModelRunner(d)


def test_missing_shard(copy_of):
    d = copy_of("llama")
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shard model-00002-of-00002.safetensors .* is missing"):
        ModelRunner(d)


def test_unknown_architecture(copy_of):
    d = copy_of("qwen2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown architecture 'MambaForCausalLM'"):
        ModelRunner(d)
    cfg.pop("architectures")
    cfg["model_type"] = "mamba"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown model_type 'mamba'"):
        ModelRunner(d)


def test_unsupported_rope_scaling(copy_of):
    d = copy_of("llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        ModelRunner(d)


def test_config_does_not_match_weights(copy_of):
    d = copy_of("qwen2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight: checkpoint shape .* does not match the weights"):
        ModelRunner(d)


def test_prm_checkpoint_is_not_a_generator(tiny):
    with pytest.raises(ValueError, match="not a generator"):
        ModelRunner(tiny["qwen2_prm"])
    with pytest.raises(ValueError, match="does not fit architecture"):
        ProcessRewardModel(tiny["qwen2_prm"], prm_format="rlhflow")


def test_prompt_longer_than_context_window(runner):
    limit = runner.config.max_position_embeddings
    table = list(range(runner.num_blocks))
    with pytest.raises(ValueError, match=f"{limit + 1} tokens .* max_position_embeddings={limit}"):
        runner.make_batch([BatchRow([1] * (limit + 1), 0, table)])
    # A decode step past the window is refused too.
    with pytest.raises(ValueError, match="max_position_embeddings"):
        runner.make_batch([BatchRow([1], limit, table)])


def test_prm_input_longer_than_context_window(tiny):
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=torch.float32)
    long_question = "Alice has 12 apples. " * 200
    with pytest.raises(ValueError, match="context window max_position_embeddings=1024"):
        prm.score_paths(long_question, [["Step 1: 12 + 5 = 17."]])


def test_bad_batches(runner):
    with pytest.raises(ValueError, match="block table has 1 blocks but 20 tokens need 2"):
        runner.make_batch([BatchRow(list(range(20)), 0, [3])])
    with pytest.raises(ValueError, match="block id 999 out of range"):
        runner.make_batch([BatchRow([1, 2], 0, [999])])
    with pytest.raises(ValueError, match="same KV cache slot"):
        runner.make_batch([BatchRow([1], 3, [5]), BatchRow([2], 3, [5])])
    with pytest.raises(ValueError, match="token id 100000 outside the vocabulary"):
        runner.make_batch([BatchRow([100000], 0, [1])])
    with pytest.raises(ValueError, match="row 0 has no new tokens"):
        runner.make_batch([BatchRow([], 0, [1])])
    with pytest.raises(ValueError, match="needs a block table"):
        runner.make_batch([BatchRow([1], 4, None)])
    with pytest.raises(ValueError, match="at least one row"):
        runner.make_batch([])


def test_bad_dtype(tiny):
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        ModelRunner(tiny["qwen2"], dtype="int8")
