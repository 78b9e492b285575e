"""model.load_format=random: every model config of the repo builds from its stored
config.json (reduced width, same architecture code path) and runs a forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.configs import PAPER_CONFIGS, config_for, paper_config, reduced
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_format import PRMInput

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"
ROLES = [(p.stem, role) for p in sorted(CONF.glob("*.yaml")) for role in ("generator", "prm")]
DIM_KEYS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size",
            "vocab_size": "vocab_size", "tie_word_embeddings": "tie_word_embeddings"}


def _model_cfg(pair: str, role: str) -> dict:
    return yaml.safe_load((CONF / f"{pair}.yaml").read_text())[role]


@pytest.mark.parametrize("pair,role", ROLES)
def test_stored_config_matches_model_yaml(pair, role):
    m = _model_cfg(pair, role)
    raw = config_for(m["hf_name"])
    cfg = ModelConfig.from_dict(raw)
    for ykey, ckey in DIM_KEYS.items():
        assert getattr(cfg, ckey) == m[ykey], (pair, role, ykey)
    assert cfg.head_dim == m["head_dim"]
    assert cfg.model_type == m["arch"]
    assert cfg.kind == ("qwen_math_prm" if m["head"] == "classifier" else "causal_lm")


def test_every_paper_model_is_stored():
    assert set(PAPER_CONFIGS) == {
        "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Math-PRM-7B", "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
    }
    assert paper_config("meta-llama/Llama-3.1-8B-Instruct")["rope_scaling"]["rope_type"] == "llama3"


@pytest.mark.parametrize("pair,role", ROLES)
def test_random_build_forward(pair, role, block_pool):
    m = _model_cfg(pair, role)
    cfg = ModelConfig.from_dict(reduced(config_for(m["hf_name"])))
    ids = [3, 17, 200, 5, 9, 41, 7]
    if cfg.kind == "causal_lm" and role == "generator":
        runner = ModelRunner(None, config=cfg, load_format="random", num_blocks=8, dtype=torch.float32)
        pool = block_pool(8)
        blocks = pool.grow([], len(ids), runner.block_size)
        batch = runner.make_batch([BatchRow(ids, 0, blocks)])
        logits = runner.compute_logits(runner.forward(batch), batch)
        assert logits.shape == (1, cfg.vocab_size) and torch.isfinite(logits).all()
        # Same seed, same weights: random builds are reproducible.
        again = ModelRunner(None, config=cfg, load_format="random", num_blocks=8, dtype=torch.float32)
        assert torch.equal(again.model.model.embed_tokens.weight, runner.model.model.embed_tokens.weight)
    else:
        prm = ProcessRewardModel(None, config=cfg, load_format="random", dtype=torch.float32)
        r = prm.score_token_ids([PRMInput(tuple(ids), (2, 6)), PRMInput((1, 2, 3), (2,))])
        assert [len(x) for x in r] == [2, 1]
        assert all(0.0 <= v <= 1.0 for x in r for v in x)
