"""The torch engine's KV memory plan (memory_plan.py): the generator's pool and, with
engine.prm_prefix_cache=true, the PRM's. CPU pools come from config; the CUDA split is
pure arithmetic over measured numbers (tested here with given numbers); the CUDA profile
itself runs on a GPU only."""

from __future__ import annotations

import logging

import pytest
import torch

from cfg_helpers import compose_cfg
from specscale.settings.search_policy import ConfigError
from specscale.engine.torch import build as torch_build
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.runtime.memory_plan import (
    MemoryPlan, allocate_profile_pool, dummy_prm_inputs, plan_memory, profile_forwards, split_usable,
)

BASE = ["engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float32", "n_problems=1"]


@pytest.fixture(scope="module")
def models():
    cfg = compose_cfg(*BASE, small=False)
    return torch_build.build_models(cfg)


def cfg_with(*overrides):
    return compose_cfg(*BASE, *overrides, small=False)


def test_cpu_plan_cache_on(models):
    runner, prm = models
    plan = plan_memory(cfg_with("engine.prm_prefix_cache=true", "engine.cpu_kv_blocks=300",
                                "engine.cpu_prm_kv_blocks=70"), runner, prm)
    assert (plan.gen_blocks, plan.prm_blocks, plan.source) == (300, 70, "cpu")
    assert plan.gen_bytes_per_block == PagedKVCache.bytes_per_block(runner.config, 16, torch.float32)
    assert plan.prm_bytes_per_block == PagedKVCache.bytes_per_block(prm.config, 16, torch.float32)
    assert plan.gen_bytes == 300 * plan.gen_bytes_per_block and plan.prm_bytes == 70 * plan.prm_bytes_per_block
    assert plan.activation_reserve_bytes == 0 and plan.prm_prefix_cache
    d = plan.as_dict()
    assert d["prm_blocks"] == 70 and d["prm_bytes"] == plan.prm_bytes and d["source"] == "cpu"


def test_cpu_plan_cache_off_has_no_prm_pool(models):
    runner, prm = models
    plan = plan_memory(cfg_with("engine.prm_prefix_cache=false", "engine.cpu_kv_blocks=300"), runner, prm)
    assert (plan.gen_blocks, plan.prm_blocks, plan.prm_bytes) == (300, 0, 0)
    assert not plan.prm_prefix_cache


def test_overrides(models, caplog):
    runner, prm = models
    plan = plan_memory(cfg_with("engine.kv_blocks=123", "engine.prm_kv_blocks=45"), runner, prm)
    assert (plan.gen_blocks, plan.prm_blocks, plan.source) == (123, 45, "config")
    plan = plan_memory(cfg_with("engine.prm_kv_blocks=45", "engine.cpu_kv_blocks=99"), runner, prm)
    assert (plan.gen_blocks, plan.prm_blocks, plan.source) == (99, 45, "cpu")
    with caplog.at_level(logging.WARNING, logger="specscale.engine.torch.runtime.memory_plan"):
        plan = plan_memory(cfg_with("engine.prm_prefix_cache=false", "engine.prm_kv_blocks=45",
                                    "engine.kv_blocks=10"), runner, prm)
    assert (plan.gen_blocks, plan.prm_blocks, plan.source) == (10, 0, "config")
    assert "engine.prm_kv_blocks=45 is ignored" in caplog.text


@pytest.mark.parametrize("key", ["kv_blocks", "prm_kv_blocks", "cpu_kv_blocks", "cpu_prm_kv_blocks"])
def test_bad_pool_sizes_name_the_setting(models, key):
    runner, prm = models
    with pytest.raises(ConfigError, match=f"engine.{key}=0: give a positive number"):
        plan_memory(cfg_with(f"engine.{key}=0"), runner, prm)


@pytest.mark.parametrize("cache", [True, False])
def test_build_allocates_the_prm_pool_only_with_the_cache(cache):
    cfg = cfg_with(f"engine.prm_prefix_cache={str(cache).lower()}", "engine.cpu_kv_blocks=200",
                   "engine.cpu_prm_kv_blocks=50")
    runner, prm = torch_build.build_models(cfg)
    plan = runner.memory_plan
    assert isinstance(plan, MemoryPlan) and plan.source == "cpu"
    assert runner.num_blocks == plan.gen_blocks == 200
    if cache:
        assert prm.kv_cache is not None and prm.num_kv_blocks == plan.prm_blocks == 50
        if isinstance(prm.kv_cache, PagedKVCache):
            assert prm.kv_cache.num_blocks == 50 and prm.kv_cache.block_size == 16
            assert prm.kv_cache.kv.element_size() * prm.kv_cache.kv.numel() == plan.prm_bytes
    else:
        assert prm.kv_cache is None and plan.prm_blocks == 0
    assert runner.kv_cache.kv.element_size() * runner.kv_cache.kv.numel() == plan.gen_bytes


def test_reused_models_get_a_prm_pool_when_a_cell_turns_the_cache_on():
    off = cfg_with("engine.prm_prefix_cache=false", "engine.cpu_kv_blocks=200")
    runner, prm = torch_build.build_models(off)
    assert prm.kv_cache is None
    on = cfg_with("engine.prm_prefix_cache=true", "engine.cpu_kv_blocks=200", "engine.cpu_prm_kv_blocks=40")
    torch_build.ensure_prm_pool(on, runner, prm)
    assert prm.num_kv_blocks == 40 and runner.memory_plan.prm_blocks == 40 and runner.num_blocks == 200


# ---------------------------------------------------------------- the CUDA split (arithmetic)
GIB = 2**30
MIB = 2**20


def test_split_cache_on():
    gen, prm = split_usable(10 * GIB, 2 * GIB, MIB, 2 * MIB, prm_cache=True, prm_fraction=0.25)
    assert prm == int(8 * GIB * 0.25) // (2 * MIB) == 1024  # the PRM's share after the reserve
    assert gen == (8 * GIB - prm * 2 * MIB) // MIB == 6144


def test_split_cache_off_reserves_only_activations():
    gen, prm = split_usable(10 * GIB, 2 * GIB, MIB, 2 * MIB, prm_cache=False, prm_fraction=0.25)
    assert (gen, prm) == (8192, 0)
    gen, _ = split_usable(10 * GIB, 2 * GIB, MIB, 2 * MIB, prm_cache=False, prm_fraction=0.25, gen_extra_blocks=1)
    assert gen == 8191  # the scratch block comes out of the generator's share


def test_split_with_a_fixed_pool_gives_the_other_the_rest():
    gen, prm = split_usable(10 * GIB, 2 * GIB, MIB, 2 * MIB, prm_cache=True, prm_fraction=0.25, gen_fixed=4096)
    assert (gen, prm) == (4096, 2048)
    gen, prm = split_usable(10 * GIB, 2 * GIB, MIB, 2 * MIB, prm_cache=True, prm_fraction=0.25, prm_fixed=100)
    assert (gen, prm) == (8192 - 200, 100)


def test_split_errors_name_the_fix():
    with pytest.raises(ConfigError, match="generator's KV cache.*gpu_memory_utilization.*engine.kv_blocks"):
        split_usable(GIB, GIB, MIB, MIB, prm_cache=False, prm_fraction=0.3)
    with pytest.raises(ConfigError, match="PRM's KV cache.*prm_kv_fraction.*engine.prm_prefix_cache=false"):
        split_usable(10 * GIB, 0, MIB, MIB, prm_cache=True, prm_fraction=0.3, gen_fixed=10 * 1024)
    with pytest.raises(ConfigError, match="generator's KV cache.*lower model.memory.prm_kv_fraction"):
        split_usable(10 * GIB, 0, MIB, MIB, prm_cache=True, prm_fraction=0.3, prm_fixed=10 * 1024)


def test_cuda_branch_with_measured_numbers(models, monkeypatch):
    """plan_memory's CUDA branch over given measurements (the profile itself needs a GPU):
    it profiles with the engine's largest batches and splits what is usable."""
    from types import SimpleNamespace

    from specscale.engine.torch.runtime import memory_plan as mp

    runner, prm = models
    seen = {}

    def fake_measure(r, p, prefill_tokens, prm_tokens, logit_rows, utilization):
        seen.update(prefill=prefill_tokens, prm=prm_tokens, rows=logit_rows, util=utilization)
        return 10 * GIB, 2 * GIB, 12 * GIB, 16 * GIB

    monkeypatch.setattr(mp, "measure_cuda", fake_measure)
    fake = SimpleNamespace(device=torch.device("cuda"), block_size=16, config=runner.config, dtype=runner.dtype)
    cfg = cfg_with("engine.max_num_batched_tokens=1024", "engine.prm_max_batch_tokens=2048", "engine.max_num_seqs=64",
                   "model.memory.gpu_memory_utilization=0.8", "model.memory.prm_kv_fraction=0.25")
    plan = plan_memory(cfg, fake, prm, scratch_block=True)
    assert seen == {"prefill": 1024, "prm": 2048, "rows": 64, "util": 0.8}
    assert plan.source == "cuda" and plan.activation_reserve_bytes == 2 * GIB and plan.usable_bytes == 10 * GIB
    want = split_usable(10 * GIB, 2 * GIB, plan.gen_bytes_per_block, plan.prm_bytes_per_block, prm_cache=True,
                        prm_fraction=0.25, gen_extra_blocks=1)
    assert (plan.gen_blocks, plan.prm_blocks) == want
    off = plan_memory(cfg_with("engine.prm_prefix_cache=false"), fake, prm)
    assert off.prm_blocks == 0 and off.gen_blocks == 8 * GIB // off.gen_bytes_per_block
    seen.clear()
    fixed = plan_memory(cfg_with("engine.kv_blocks=10", "engine.prm_kv_blocks=5"), fake, prm)
    assert (fixed.gen_blocks, fixed.prm_blocks, fixed.source) == (10, 5, "config") and not seen  # no probing
    with pytest.raises(ConfigError, match="model.memory.prm_kv_fraction=1.0"):
        plan_memory(cfg_with("model.memory.prm_kv_fraction=1.0"), fake, prm)


def test_profile_forwards_run_on_any_device(models):
    """The profile's work (a PRM batch of whole windows, a prefill over a pool of exactly
    its blocks, logits of many rows) runs; on CUDA its peak memory is the reserve."""
    runner, prm = models
    window = prm.max_model_len
    inputs = dummy_prm_inputs(prm, window + 10)
    assert [len(i.token_ids) for i in inputs] == [window, 10]
    assert all(i.reward_positions == (len(i.token_ids) - 1,) for i in inputs)
    allocate_profile_pool(runner, 100)
    assert runner.num_blocks == 7
    profile_forwards(runner, prm, prefill_tokens=100, prm_tokens=64, logit_rows=32)
    torch_build.allocate_kv(cfg_with(), runner, prm)  # back to the planned pools
    assert runner.num_blocks == runner.memory_plan.gen_blocks


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cache", [True, False])
def test_cuda_plan_is_measured(cache):
    cfg = compose_cfg("engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=bfloat16",
                      "engine.device=cuda", "engine.attention=torch", "engine.max_num_batched_tokens=2048",
                      "engine.prm_max_batch_tokens=4096", f"engine.prm_prefix_cache={str(cache).lower()}",
                      "model.memory.gpu_memory_utilization=0.5", "n_problems=1", small=False)
    runner, prm = torch_build.build_models(cfg)
    plan = runner.memory_plan
    assert plan.source == "cuda" and plan.activation_reserve_bytes > 0 and plan.usable_bytes > 0
    assert (plan.prm_blocks > 0) == cache and (prm.kv_cache is not None) == cache
    used = plan.gen_bytes + plan.prm_bytes + plan.activation_reserve_bytes
    assert used <= plan.usable_bytes
    if cache:
        assert plan.prm_bytes == pytest.approx(0.3 * (plan.usable_bytes - plan.activation_reserve_bytes),
                                               abs=plan.prm_bytes_per_block)
    # The pools hold what the plan says, and serving-size work fits beside them.
    assert runner.num_blocks == plan.gen_blocks
    runner.dummy_prefill(2048, 256)
