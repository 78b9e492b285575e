"""The cached cos/sin table gives, bit for bit, what the per-forward formula gave before it
(float32 angles, cast to the model dtype), for any batch of positions."""
from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.model import rotary
from specscale.engine.torch.model_config import load_model_config
from specscale.engine.torch.model.rotary import RotaryEmbedding


def formula_before_the_table(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """RotaryEmbedding.cos_sin as it was before the table (commit 0a5bf98), verbatim."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("name", ["qwen2", "llama"])  # plain RoPE and llama3 frequency scaling
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_table_rows_equal_the_formula(tiny, name, dtype, monkeypatch):
    monkeypatch.setattr(rotary, "BUILD_CHUNK", 100)  # several build passes: their seams are covered too
    rope = RotaryEmbedding(load_model_config(tiny[name]))
    window = rope.max_positions
    g = torch.Generator().manual_seed(0)
    batches = [torch.arange(window), torch.tensor([0]), torch.tensor([window - 1]), torch.tensor([99, 100, 101])]
    batches += [torch.randint(0, window, (n,), generator=g) for n in (1, 2, 7, 16, 33, 257, 3000)]
    for positions in batches:
        cos, sin = rope.cos_sin(positions, dtype)
        ref_cos, ref_sin = formula_before_the_table(rope.inv_freq, positions, dtype)
        assert cos.dtype == dtype and cos.shape == ref_cos.shape
        assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin), (name, dtype, positions.numel())


def test_one_table_per_device_and_dtype(tiny):
    rope = RotaryEmbedding(load_model_config(tiny["qwen2"]))
    first = rope.table("cpu", torch.float32)
    assert rope.table(torch.device("cpu"), torch.float32)[0] is first[0]  # built once
    assert rope.table("cpu", torch.float64)[0].dtype == torch.float64
    assert first[0].shape == (rope.max_positions, load_model_config(tiny["qwen2"]).head_dim)


def test_reserve_extends_the_window_with_the_same_values(tiny):
    """A PRM whose window is overridden past the config reads positions beyond it."""
    rope = RotaryEmbedding(load_model_config(tiny["qwen2"]))
    window = rope.max_positions
    short = rope.table("cpu", torch.float32)[0]
    rope.reserve(window // 2)  # never shrinks
    assert rope.table("cpu", torch.float32)[0] is short
    rope.reserve(window + 50)
    longer = rope.table("cpu", torch.float32)[0]
    assert longer.shape[0] == window + 50 and torch.equal(longer[:window], short)
    positions = torch.arange(window, window + 50)
    assert torch.equal(rope.cos_sin(positions, torch.float32)[0],
                       formula_before_the_table(rope.inv_freq, positions, torch.float32)[0])


def test_models_build_their_table_at_load(tiny):
    from specscale.engine.torch.runtime.model_runner import ModelRunner
    from specscale.engine.torch.prm.model import ProcessRewardModel

    runner = ModelRunner(tiny["qwen2"], num_blocks=4, dtype=torch.float64)
    assert (torch.device("cpu"), torch.float64) in runner.model.model.rotary._tables
    window = load_model_config(tiny["qwen2_prm"]).max_position_embeddings
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=torch.float32, max_model_len=window + 8)
    cos, _ = prm.model.model.rotary._tables[torch.device("cpu"), torch.float32]
    assert cos.shape[0] == window + 8
