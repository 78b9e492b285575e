"""Roofline cost model: regimes, saturation, KV capacity, config handling."""

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from specscale.engine.sim.cost_model import CostModel, CostParams
from specscale.engine.sim.hardware import GIB, HardwareProfile
from specscale.engine.sim.model_dims import ModelDims

CONF = Path(__file__).resolve().parents[3] / "conf"


def model_cfg(name):
    return OmegaConf.load(CONF / "model" / f"{name}.yaml")


def hw_cfg(name):
    return OmegaConf.load(CONF / "hardware" / f"{name}.yaml")


def make(model="qwen2.5-7b", hw="a100", **cost):
    return CostModel.from_configs(model_cfg(model), hw_cfg(hw), cost or None)


def ctx(batch, length):
    return np.full(batch, length, dtype=np.int64)


# ---- hardware ----------------------------------------------------------------------

def test_hardware_profiles_load():
    a100, h100, h200 = (HardwareProfile.from_config(hw_cfg(n)) for n in ("a100", "h100", "h200"))
    assert a100.memory_bytes == 80 * GIB and h100.memory_bytes == 80 * GIB
    assert h200.memory_bytes == 141 * GIB
    assert a100.hbm_bandwidth_bytes_s == pytest.approx(2.039e12)
    assert h100.hbm_bandwidth_bytes_s == pytest.approx(3.35e12)
    assert h200.hbm_bandwidth_bytes_s == pytest.approx(4.8e12)
    assert a100.bf16_flops == pytest.approx(312e12)
    assert h100.bf16_flops == pytest.approx(989e12) == h200.bf16_flops
    with pytest.raises(ValueError, match="memory_tb"):
        HardwareProfile.from_config({**OmegaConf.to_container(hw_cfg("a100")), "memory_tb": 1})


# ---- generation --------------------------------------------------------------------

def test_generation_monotone_in_rows_and_context():
    cm = make()
    by_rows = [cm.generation_seconds(ctx(b, 1500), [], b) for b in (1, 2, 8, 32, 64, 128, 256, 512, 1024)]
    assert all(a < b for a, b in zip(by_rows, by_rows[1:]))
    by_ctx = [cm.generation_seconds(ctx(64, c), [], 64) for c in (16, 256, 1024, 4096, 16384)]
    assert all(a < b for a, b in zip(by_ctx, by_ctx[1:]))
    by_chunk = [cm.generation_seconds(ctx(8, 500), [(n, 100)], 9) for n in (1, 64, 512, 4096)]
    assert all(a < b for a, b in zip(by_chunk, by_chunk[1:]))


def test_batch_one_decode_is_memory_bound():
    cm = make()
    g, p = cm.generator, cm.params
    mem_s, comp_s = cm.generation_roofline(ctx(1, 32), [], 1)
    assert comp_s < mem_s
    bw = cm.hardware.hbm_bandwidth_bytes_s * p.bandwidth_efficiency
    streamed = g.body_read_bytes() + g.head_read_bytes()
    t = cm.generation_seconds(ctx(1, 32), [], 1)
    assert t == pytest.approx(p.gen_iteration_overhead_s + streamed / bw, rel=1e-3)
    # i.e. roughly weights / BW' + overhead (untied: the input embedding is only gathered)
    assert t == pytest.approx(p.gen_iteration_overhead_s + g.weight_bytes() / bw, rel=0.1)
    assert cm.decode_roofline_fraction(1, 32) < 1.0
    assert cm.decode_roofline_fraction(1, 32) < cm.decode_roofline_fraction(64, 32)
    assert cm.decode_roofline_fraction(1024, 32) == 1.0  # large short-context batches hit the compute roof


def test_huge_prefill_is_compute_bound():
    cm = make()
    g, p = cm.generator, cm.params
    n = 16384
    mem_s, comp_s = cm.generation_roofline([], [(n, 0)], 1)
    assert comp_s > 5 * mem_s
    flops = g.matmul_flops_per_token * n + g.lm_head_flops_per_row + g.attention_flops(n, 0)
    ideal = flops / (cm.hardware.bf16_flops * p.mfu)
    t = cm.generation_seconds([], [(n, 0)], 1)
    assert t == pytest.approx(ideal + p.gen_iteration_overhead_s, rel=0.01)


def test_lm_head_charged_only_for_logit_rows_and_empty_iteration():
    cm = make()
    assert cm.generation_seconds(ctx(4, 100), [(256, 0)], 5) > cm.generation_seconds(ctx(4, 100), [(256, 0)], 4)
    assert cm.generation_seconds(np.zeros(0, dtype=np.int64), [], 0) == 0.0
    assert cm.generation_seconds([100, 200], [], 2) == cm.generation_seconds(np.array([100, 200]), [], 2)
    with pytest.raises(ValueError):
        cm.generation_seconds(ctx(2, 100), [], 3)


def test_faster_hardware_is_faster():
    a, h = make(hw="a100"), make(hw="h100")
    for args in ((ctx(64, 1500), [], 64), ([], [(8192, 0)], 1)):
        assert h.generation_seconds(*args) < a.generation_seconds(*args)


def test_prm_saturates_near_2k_tokens():
    for model in ("qwen2.5-7b", "llama3.1-8b"):
        cm = make(model)
        p = cm.prm
        flops_per_token = p.matmul_flops_per_token + p.lm_head_flops_per_row

        def eff(tasks):
            n = sum(t[0] for t in tasks)
            flops = flops_per_token * n + sum(p.attention_flops(q, c) for q, c in tasks)
            asymptote_tok_s = n * cm.hardware.bf16_flops * cm.params.mfu / flops
            return (n / cm.prm_seconds(tasks)) / asymptote_tok_s

        e2048 = eff([(256, 0)] * 8)
        e256 = eff([(256, 0)])
        assert e2048 >= 0.75, e2048
        assert e256 < 0.5 and e256 < e2048 - 0.3
        assert eff([(128, 400)] * 16) >= 0.75
        assert eff([(256, 0)] * 64) > 0.95


def test_prm_empty_and_monotone():
    cm = make()
    assert cm.prm_seconds([]) == 0.0
    assert cm.prm_seconds([(0, 100)]) == 0.0
    assert cm.prm_seconds([(100, 0)]) < cm.prm_seconds([(200, 0)]) < cm.prm_seconds([(200, 0), (50, 0)])
    assert cm.prm_seconds([(100, 2000)]) > cm.prm_seconds([(100, 0)])  # attention over cached ctx
    assert cm.prm_seconds([(1, 0)]) > cm.params.prm_batch_overhead_s
    with pytest.raises(ValueError):
        cm.prm_seconds([(-1, 0)])


# ---- memory ------------------------------------------------------------------------

def test_kv_capacity_a100_qwen7b_by_hand():
    cm = make("qwen2.5-7b", "a100")
    budget = int(80 * 2**30 * 0.9)
    per_token = (4 * 3584 + 3 * 18944) * 2  # one decoder layer's live activations per token (bf16)
    activations = 8192 * per_token + 256 * 152064 * 4 + 8192 * per_token  # generator (+ fp32 logits) and PRM
    assert cm.activation_bytes() == (8192 * per_token + 256 * 152064 * 4, 8192 * per_token)
    usable = budget - 2 * 7_615_616_512 - 2 * 7_083_474_946 - activations  # weights of both models, workspace
    prm_bytes = int(usable * 0.3)
    expected = ((usable - prm_bytes) // 57_344, prm_bytes // 57_344)
    assert cm.kv_capacity_tokens() == expected
    assert expected[0] > 500_000 and expected[1] > 200_000
    assert cm.kv_capacity_blocks(16) == (expected[0] // 16, expected[1] // 16)


def test_kv_capacity_h200_larger_and_overflow_raises():
    a, h = make("qwen2.5-7b", "a100"), make("qwen2.5-7b", "h200")
    assert all(x > y for x, y in zip(h.kv_capacity_tokens(), a.kv_capacity_tokens()))
    cfg = model_cfg("llama3.1-8b")
    small = HardwareProfile("24GB-card", 24 * GIB, 1e12, 100e12)
    cm = CostModel(ModelDims.from_config(cfg.generator), ModelDims.from_config(cfg.prm), small)
    with pytest.raises(ValueError, match="do not fit"):
        cm.kv_capacity_tokens()


# ---- params --------------------------------------------------------------------------

def test_cost_params_from_config():
    assert CostParams.from_config(None) == CostParams()
    assert CostParams.from_config({}) == CostParams()
    p = CostParams.from_config(OmegaConf.create({"mfu": 0.5, "gen_half_efficiency_tokens": 256,
                                                 "host_prm_on_critical_path": False}))
    assert p.mfu == 0.5 and p.gen_half_efficiency_tokens == 256 and isinstance(p.gen_half_efficiency_tokens, int)
    assert p.host_prm_on_critical_path is False
    with pytest.raises(ValueError, match="host_prm_on_critical_path must be true or false"):
        CostParams.from_config({"host_prm_on_critical_path": 1})
    assert p.bandwidth_efficiency == CostParams().bandwidth_efficiency
    with pytest.raises(ValueError, match="mfuu"):
        CostParams.from_config({"mfuu": 0.5})
    with pytest.raises(ValueError):
        CostParams(mfu=1.5)


def test_grouped_prm_cost_equals_the_cost_of_the_tasks_one_by_one():
    cm = make()
    tasks = [(40, 300)] * 7 + [(25, 120)] * 3
    assert cm.prm_seconds_groups([(7, 40, 300), (3, 25, 120)]) == pytest.approx(cm.prm_seconds(tasks), rel=1e-12)
    assert cm.prm_seconds_groups([]) == 0.0 and cm.prm_seconds_groups([(4, 0, 100)]) == 0.0
