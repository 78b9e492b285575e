"""engine=vllm settings: every CPU caveat is a ConfigError naming the setting to change,
raised before any vLLM engine starts."""
from __future__ import annotations

import pytest

from cfg_helpers import compose_cfg

from specscale.settings.search_policy import ConfigError
from specscale.engine.vllm.build import build_vllm
from specscale.settings.vllm_engine import on_cuda
from specscale.settings import CellSpec

# The head size, block size and memory share checks are the CPU build's limits.
pytestmark = pytest.mark.skipif(on_cuda(), reason="checks of vLLM's CPU build")

BASE = ["engine=vllm", "model=tiny_vllm", "progress=false", "wandb.mode=disabled", "n_problems=1"]


@pytest.mark.parametrize("overrides, names", [
    (["model=tiny"], ["head_dim 16", "model=tiny_vllm"]),
    (["engine.block_size=16"], ["engine.block_size=16", "multiple of 32"]),
    (["engine.max_num_batched_tokens=256"], ["engine.max_num_batched_tokens", ">= 4096"]),
    (["engine.gpu_memory_utilization=0.8"], ["engine.gpu_memory_utilization", "<= 0.5"]),
    (["engine.prm_prefix_cache=true"], ["engine.prm_prefix_cache=false"]),
    (["engine.max_model_len=512", "engine.kv_blocks=8"], ["engine.kv_blocks", ">= 16"]),
    (["model.prm.format=rlhflow_llama_prm"], ["model.prm.format", "Qwen2ForProcessRewardModel"]),
    (["model.prm.format=orm"], ["model.prm.format", "unknown PRM format"]),
    (["engine.prm_max_batch_tokens=512"], ["engine.prm_max_batch_tokens"]),
])
def test_cpu_caveats_name_the_setting(overrides, names):
    if "model=tiny" in overrides:
        cfg = compose_cfg(*[o for o in BASE if o != "model=tiny_vllm"], *overrides, small=False)
    else:
        cfg = compose_cfg(*BASE, *overrides, small=False)
    with pytest.raises(ConfigError) as err:
        build_vllm(CellSpec.from_config(cfg))
    for name in names:
        assert name in str(err.value), str(err.value)
