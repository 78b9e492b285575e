"""engine.fused_ops: the compiled hot ops (residual add + RMSNorm, SiLU x up, rotary) compute
what the eager ops compute, are compiled in warm-up (serving compiles nothing), fall back to
eager with one warning when compiling fails, and leave the search tree as it was.

Fused is not bit-identical to eager: the norm runs in float32 in every model dtype (as in
transformers) and inductor sums its mean of squares in another order, so fused and eager
agree to float32 round-off, float64 models included. The purely elementwise parts (the
residual add, SiLU x up, the rotary) agree to float64 round-off.

Compiling takes seconds on this CPU: the compiled op set is shared by every model of the
module (dynamo keeps one graph per op and shape class, whatever the model), and each
runner is built once (module-scoped fixtures).
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from cfg_helpers import compose_cfg
from contract import assert_same_tree
from specscale.cell import build_server
from specscale.engine.torch.model import fused_ops as fused_ops_module
from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.model.fused_ops import FusedOps, warm_lengths
from specscale.engine.torch.model.hot_ops import EAGER_OPS, HotOps
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_rows import PRMRow

FLOAT32_ROUNDOFF = 1e-5  # relative, logits (conftest's float32 tolerance)
FLOAT64_ROUNDOFF = 1e-12
NUM_BLOCKS = 64
BS = 16


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def switch():
    """One switch for every model of the module, as build shares one per model pair."""
    return FusedOps(True)


@pytest.fixture(scope="module")
def runners(tiny, switch):
    """(name, dtype) -> (eager runner, fused runner, its warm-up seconds), built once."""
    cache = {}

    def get(name: str, dtype: torch.dtype):
        if (name, dtype) not in cache:
            eager = ModelRunner(tiny[name], num_blocks=NUM_BLOCKS, block_size=BS, dtype=dtype)
            fused = ModelRunner(tiny[name], num_blocks=NUM_BLOCKS, block_size=BS, dtype=dtype, fused_ops=switch)
            cache[name, dtype] = eager, fused, fused.warm_up()
        return cache[name, dtype]

    return get


def compiles() -> tuple[int, int]:
    """Dynamo's running counts of frames compiled and graphs made (process-wide)."""
    return counters["frames"]["ok"], counters["stats"]["unique_graphs"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def serve_logits(runner: ModelRunner, g: torch.Generator) -> list[torch.Tensor]:
    """A prefill of three rows over the paged cache, then decode steps of all of them,
    then of one alone (a token count of 1): the logits of each forward's last tokens."""
    prompt_lens = [29, 1, 40]
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(prompt_lens))]
    rows = [BatchRow(torch.randint(0, 400, (n,), generator=g).tolist(), 0, t) for n, t in zip(prompt_lens, tables)]
    out, lens = [], list(prompt_lens)
    batch = runner.make_batch(rows)
    out.append(runner.compute_logits(runner.forward(batch), batch))
    for step in range(3):
        active = range(len(lens)) if step < 2 else [2]
        rows = [BatchRow([int(out[-1][j % out[-1].shape[0]].argmax())], lens[i], tables[i])
                for j, i in enumerate(active)]
        batch = runner.make_batch(rows)
        out.append(runner.compute_logits(runner.forward(batch), batch))
        for i in active:
            lens[i] += 1
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_fused_logits_match_eager(runners, name, dtype):
    eager, fused, _ = runners(name, dtype)
    assert fused.model.model.hot_ops.compiled and eager.model.model.hot_ops is EAGER_OPS
    ours = serve_logits(fused, torch.Generator().manual_seed(3))
    ref = serve_logits(eager, torch.Generator().manual_seed(3))
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert rel(a, b) <= FLOAT32_ROUNDOFF, f"forward {i}: {rel(a, b):.2e}"


def test_elementwise_ops_agree_to_float64_roundoff(runners, switch):
    """The compiled residual add, SiLU x up and rotary on float64 inputs of every shape class."""
    runners("qwen2", torch.float64)  # compiled and warm
    ops: HotOps = switch.ops
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():  # as served: dynamo guards on inference tensors
        for t in (1, 5, 64):
            x, res = (torch.randn(t, 64, generator=g, dtype=torch.float64) for _ in range(2))
            w = torch.rand(64, generator=g, dtype=torch.float64) + 0.5
            normed, summed = ops.add_rms_norm(x, res, w, 1e-6)
            ref_normed, ref_summed = EAGER_OPS.add_rms_norm(x, res, w, 1e-6)
            assert torch.equal(summed, ref_summed)
            assert rel(normed, ref_normed) <= FLOAT32_ROUNDOFF  # the norm itself runs in float32
            gate_up = torch.randn(t, 256, generator=g, dtype=torch.float64)
            assert rel(ops.silu_mul(gate_up), EAGER_OPS.silu_mul(gate_up)) <= FLOAT64_ROUNDOFF
            qkv = torch.randn(t, 8, 16, generator=g, dtype=torch.float64)
            cos, sin = torch.randn(2, t, 16, generator=g, dtype=torch.float64)
            got, want = ops.rotary(qkv[:, :6], cos, sin), EAGER_OPS.rotary(qkv[:, :6], cos, sin)
            assert rel(got, want) <= FLOAT64_ROUNDOFF
    assert not counters["graph_break"]  # each op compiled whole


def test_warm_up_compiles_everything_serving_uses(tiny):
    """After warm-up, decode of 1..20 rows (directly and through the decode-graph buckets),
    prefills of other lengths and PRM batches, cached and not, compile nothing."""
    torch._dynamo.reset()  # as in a fresh process: what is compiled, this test's warm-up compiled
    switch = FusedOps(True)
    runner = ModelRunner(tiny["qwen2"], num_blocks=NUM_BLOCKS, block_size=BS, dtype=torch.float32, fused_ops=switch)
    graphs = ModelRunner(tiny["qwen2"], num_blocks=NUM_BLOCKS, block_size=BS, dtype=torch.float32, fused_ops=switch)
    graphs.enable_decode_graphs(max_batch=16, replay="eager")
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=torch.float32, fused_ops=switch)
    prm.allocate_kv_cache(32, BS)
    seconds = runner.warm_up()
    assert seconds > 0 and runner.warmup_seconds == pytest.approx(seconds)
    graphs.warm_up(max_context=64)
    prm.warm_up()
    assert runner.model.model.hot_ops.compiled
    assert graphs.model.model.hot_ops.compiled and prm.model.model.hot_ops.compiled
    before = compiles()
    g = torch.Generator().manual_seed(1)
    for model in (runner, graphs):
        for rows in (1, 2, 3, 7, 16, 20):
            model.forward(model.make_batch([BatchRow([5], 3 + r % 10, [r]) for r in range(rows)]))
        for n in (2, 3, 16, 17, 100):
            model.forward(model.make_batch([BatchRow(torch.randint(0, 400, (n,), generator=g).tolist(), 0,
                                                     list(range(-(-n // BS))))]))
    assert graphs.graphs.replays > 0
    paths = [PRMRow(list(range(10, 10 + n)), 0, None, [n - 1]) for n in (1, 2, 9, 33)]
    prm.score_rows(paths)
    prm.score_rows(paths[:1])
    prm.score_rows([PRMRow(list(range(10, 30)), 0, [0, 1], [19]), PRMRow([7], 20, [0, 1], [0])])
    assert compiles() == before


def fingerprint_test():
    """tests/engine/torch/test_tree_fingerprint.py as a module (its directory is not on the
    path under --import-mode=importlib): its config and recorded eager tree are the reference."""
    path = Path(__file__).with_name("test_tree_fingerprint.py")
    spec = importlib.util.spec_from_file_location("recorded_tree_fingerprint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_tree_equals_eager_in_float64():
    """The hidden-style float64 cell (tests/engine/torch/test_tree_fingerprint.py) served
    with fused ops: same members, texts, selections and answers as eager; scores to float32
    round-off of the norm. Nothing is compiled while serving."""
    recorded = fingerprint_test()
    HIDDEN_STYLE, RECORDED_TREE, fingerprint = recorded.HIDDEN_STYLE, recorded.RECORDED_TREE, recorded.fingerprint
    cfg = compose_cfg(*HIDDEN_STYLE, "policy=spec", small=False)
    assert cfg["engine"]["fused_ops"] is False  # the default the fingerprint test runs: eager
    eager = build_server(cfg).run()
    assert fingerprint(eager) == RECORDED_TREE
    torch._dynamo.reset()  # only this cell's warm-up may have compiled what it serves with
    server = build_server(compose_cfg(*HIDDEN_STYLE, "policy=spec", "engine.fused_ops=true", small=False))
    assert server.backend.runner.model.model.hot_ops.compiled
    assert server.backend.prm.model.model.hot_ops.compiled
    before = compiles()
    fused = server.run()
    assert compiles() == before
    assert_same_tree(fused, eager, "fused ops vs eager, float64", score_tol=1e-6)


def test_compile_failure_falls_back_to_eager_with_one_warning(tiny, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("inductor: no working C++ compiler")

    monkeypatch.setattr(fused_ops_module, "compiled_ops", lambda: HotOps(broken, broken, broken, broken, True))
    switch = FusedOps(True)
    runner = ModelRunner(tiny["llama"], num_blocks=8, block_size=BS, dtype=torch.float32, fused_ops=switch)
    prm = ProcessRewardModel(tiny["llama_prm"], dtype=torch.float32, fused_ops=switch)
    with caplog.at_level(logging.WARNING, logger=fused_ops_module.__name__):
        runner.warm_up()
        prm.warm_up()
    warnings = [r for r in caplog.records if r.name == fused_ops_module.__name__]
    assert len(warnings) == 1 and "engine.fused_ops" in warnings[0].getMessage()
    assert "no working C++ compiler" in warnings[0].getMessage()
    assert runner.model.model.hot_ops is EAGER_OPS and prm.model.model.hot_ops is EAGER_OPS
    assert not switch.active and switch.failure
    batch = runner.make_batch([BatchRow([1, 2, 3], 0, [0])])
    assert torch.isfinite(runner.forward(batch)).all()  # serves, eagerly


def test_switching_off_restores_eager_and_recaptures_graphs(tiny, runners, switch):
    """A reused pair serving a cell with the other setting: the op set follows the cell, and
    decode graphs captured with the old set are captured again."""
    runners("qwen2", torch.float32)  # compiled and warm
    local = FusedOps(True, ops=switch.ops)
    runner = ModelRunner(tiny["qwen2"], num_blocks=NUM_BLOCKS, block_size=BS, dtype=torch.float32, fused_ops=local)
    runner.enable_decode_graphs(max_batch=4, replay="eager")
    runner.warm_up(max_context=32)
    first = runner.graphs
    assert runner.model.model.hot_ops.compiled and first.num_captured > 0
    local.enabled = False
    runner.warm_up(max_context=32)
    assert runner.model.model.hot_ops is EAGER_OPS and runner.graphs is not first
    assert runner.graphs.num_captured == first.num_captured


def test_warm_lengths_avoid_the_model_dimensions(tiny):
    from specscale.engine.torch.model_config import load_model_config

    for name in ("qwen2", "llama", "qwen2_h64"):
        c = load_model_config(tiny[name])
        one, n = warm_lengths(c)
        assert one == 1 and n >= 2
        assert n not in {c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                         c.head_dim, c.head_dim // 2, c.num_attention_heads + c.num_key_value_heads,
                         c.num_attention_heads + 2 * c.num_key_value_heads}
