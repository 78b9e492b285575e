"""Architecture facts: parameter counts, KV bytes, FLOP formulas, conf/model files."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specscale.engine.sim.model_dims import ModelDims, dtype_bytes

CONF = Path(__file__).resolve().parents[3] / "conf"
PAIRS = ["qwen2.5-3b", "qwen2.5-7b", "llama3.2-3b", "llama3.1-8b"]

# Published parameter counts (model cards / HF safetensors metadata).
PUBLISHED = {
    "Qwen/Qwen2.5-3B-Instruct": 3.09e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.62e9,
    "meta-llama/Llama-3.2-3B-Instruct": 3.21e9,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
    "Qwen/Qwen2.5-Math-PRM-7B": 7.07e9,
    "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data": 8.03e9,
}


def load_pair(name):
    cfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    return cfg, ModelDims.from_config(cfg.generator), ModelDims.from_config(cfg.prm)


@pytest.mark.parametrize("name", PAIRS)
def test_n_params_match_published_sizes(name):
    _, gen, prm = load_pair(name)
    for dims in (gen, prm):
        published = PUBLISHED[dims.hf_name]
        assert abs(dims.n_params / published - 1) < 0.02, (dims.hf_name, dims.n_params)


def test_exact_counts_known_checkpoints():
    _, gen, prm = load_pair("qwen2.5-7b")
    assert gen.n_params == 7_615_616_512  # Qwen2.5-7B safetensors total
    # PRM = generator without LM head + Linear(h,h) + Linear(h,2), both with bias.
    h = 3584
    assert prm.n_params == gen.n_params - 152064 * h + (h * h + h) + (2 * h + 2)


def test_kv_bytes_per_token_qwen7b():
    _, gen, prm = load_pair("qwen2.5-7b")
    assert gen.kv_bytes_per_token() == 57_344 == 28 * 2 * 4 * 128 * 2
    assert gen.kv_bytes_per_token(4) == 2 * 57_344
    assert prm.kv_bytes_per_token() == 57_344


def test_tied_head_counts_embedding_once():
    _, gen3b, _ = load_pair("qwen2.5-3b")
    assert gen3b.tie_word_embeddings
    assert gen3b.head_params == 0
    assert gen3b.n_params == gen3b.embedding_params + gen3b.body_params
    # A tied head is still read (it is the embedding matrix) when logits are needed.
    assert gen3b.head_read_params == gen3b.embedding_params
    assert gen3b.weight_bytes() == 2 * gen3b.n_params


def test_heads():
    _, qgen, qprm = load_pair("qwen2.5-7b")
    _, lgen, lprm = load_pair("llama3.1-8b")
    assert qprm.head == "classifier" and lprm.head == "lm_tokens" and qgen.head == "lm"
    h = qprm.hidden_size
    assert qprm.lm_head_flops_per_row == 2 * (h * h + 2 * h)
    assert lprm.lm_head_flops_per_row == 4 * lprm.hidden_size
    assert qgen.lm_head_flops_per_row == 2 * 152064 * 3584
    # The Llama PRM keeps its full LM head in memory but reads only two rows.
    assert lprm.n_params == lgen.n_params
    assert lprm.head_read_params == 2 * lprm.hidden_size


def test_matmul_flops_close_to_two_times_non_embedding_params():
    for name in PAIRS:
        _, gen, _ = load_pair(name)
        assert gen.matmul_flops_per_token == 2 * gen.num_layers * gen.layer_matmul_params
        assert abs(gen.matmul_flops_per_token / (2 * gen.n_params_non_embedding) - 1) < 0.001


def test_attention_flops_formula():
    _, gen, _ = load_pair("qwen2.5-7b")
    k = 4 * gen.num_layers * gen.num_heads * gen.head_dim
    # decode row with ctx 1000 (incl. itself) = 1 new token after 999 cached
    assert gen.attention_flops(1, 999) == k * 1000
    # causal prefill of q tokens from scratch: q(q+1)/2 query-key pairs
    assert gen.attention_flops(10, 0) == k * 55
    # chunked prefill adds up to the unchunked one
    assert gen.attention_flops(200, 0) + gen.attention_flops(300, 200) + gen.attention_flops(500, 500) == gen.attention_flops(1000, 0)


def test_from_config_rejects_unknown_and_ignores_format():
    cfg, _, prm = load_pair("qwen2.5-7b")
    assert "format" in cfg.prm  # non-architecture key is skipped
    d = dict(OmegaConf.to_container(cfg.generator))
    d["hiden_size"] = 1
    with pytest.raises(ValueError, match="hiden_size"):
        ModelDims.from_config(d)
    d = dict(OmegaConf.to_container(cfg.generator))
    del d["head_dim"]
    assert ModelDims.from_config(d).head_dim == 3584 // 28
    with pytest.raises(ValueError):
        ModelDims.from_config({**OmegaConf.to_container(cfg.generator), "arch": "gpt2"})


@pytest.mark.parametrize("name", PAIRS)
def test_model_conf_schema(name):
    cfg, gen, prm = load_pair(name)
    assert cfg.name == name
    assert set(cfg.keys()) == {"name", "generator", "prm", "prm_format", "load_format", "dtype", "memory", "sim"}
    assert set(cfg.prm_format.keys()) == {"prompt_overhead_tokens", "tokens_per_step", "closing_tokens"}
    assert set(cfg.memory.keys()) == {"gpu_memory_utilization", "prm_kv_fraction"}
    assert dtype_bytes(cfg.dtype) == 2
    assert gen.head == "lm"
    if name.startswith("qwen"):
        assert cfg.prm.format == "qwen_math_prm" and prm.hf_name == "Qwen/Qwen2.5-Math-PRM-7B"
        assert cfg.prm_format.tokens_per_step == 1 and cfg.sim.exact_one_share == 0.35
        assert gen.arch == prm.arch == "qwen2" and gen.qkv_bias
    else:
        assert cfg.prm.format == "rlhflow_llama_prm"
        assert prm.hf_name == "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data"
        assert cfg.prm_format.tokens_per_step == 10 and cfg.sim.exact_one_share == 0.05
        assert gen.arch == prm.arch == "llama" and not gen.qkv_bias
    assert cfg.prm_format.prompt_overhead_tokens == 30
