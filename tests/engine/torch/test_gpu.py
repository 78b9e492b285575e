"""GPU checks (skipped without CUDA; run by runners/gpu_check.sh): FlashInfer attention
equals the torch backend, CUDA-graph replay equals eager (torch and FlashInfer attention),
logits equal transformers (prefill, and decode steps replayed from CUDA graphs). The
FlashInfer cases skip when flashinfer-python is not importable."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.configs import config_for, reduced
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_format import PRMInput

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _flashinfer():
    from specscale.engine.torch.attention.flashinfer import flashinfer_available

    if not flashinfer_available():
        pytest.skip("flashinfer-python is not importable")


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


# head_dim 128 (FlashInfer's kernels are built for 64/128/256), GQA 8:2, 2 layers.
def small_cfg(name="Qwen/Qwen2.5-7B-Instruct"):
    return ModelConfig.from_dict(reduced(config_for(name), hidden=1024, heads=8, layers=2, vocab=2048,
                                         intermediate=2048))


def runner_pair(name, attention_names):
    from specscale.engine.torch.attention.select import make_attention_backend

    cfg = small_cfg(name)
    out = []
    for a in attention_names:
        r = ModelRunner(None, config=cfg, load_format="random", num_blocks=256, dtype=torch.bfloat16,
                        device="cuda", seed=0)
        r.backend = make_attention_backend(a, r.device, r.config, r.dtype)
        out.append(r)
    return out


def prefill_then_decode(runner, lens=(37, 5, 70, 16)):
    """Prefill rows of several lengths, then 3 decode steps; logits of every step."""
    g = torch.Generator().manual_seed(0)
    tables, hist, outs = [], [], []
    nxt = 0
    for n in lens:
        blocks = list(range(nxt, nxt + 8))
        nxt += 8
        tables.append(blocks)
        hist.append(torch.randint(0, runner.config.vocab_size, (n,), generator=g).tolist())
    b = runner.make_batch([BatchRow(h, 0, t) for h, t in zip(hist, tables)])
    outs.append(runner.compute_logits(runner.forward(b), b))
    for step in range(3):
        toks = [int(x) for x in outs[-1].argmax(-1).tolist()]
        b = runner.make_batch([BatchRow([t], len(h), tb) for t, h, tb in zip(toks, hist, tables)])
        for h, t in zip(hist, toks):
            h.append(t)
        outs.append(runner.compute_logits(runner.forward(b), b))
    return outs


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"])
def test_flashinfer_equals_torch_backend(name):
    _flashinfer()
    ref, fi = runner_pair(name, ["torch", "flashinfer"])
    assert fi.backend.name == "flashinfer"
    for a, b in zip(prefill_then_decode(fi), prefill_then_decode(ref)):
        assert rel(a, b) < 3e-2


def test_flashinfer_prm_equals_torch():
    _flashinfer()
    from specscale.engine.torch.attention.select import make_attention_backend

    cfg = ModelConfig.from_dict(reduced(config_for("Qwen/Qwen2.5-Math-PRM-7B"), hidden=1024, heads=8, layers=2,
                                        vocab=2048, intermediate=2048))
    prm = ProcessRewardModel(None, config=cfg, load_format="random", dtype=torch.bfloat16, device="cuda")
    inputs = [PRMInput(tuple(range(5, 5 + n)), (n // 2, n - 1)) for n in (40, 9, 130)]
    want = prm.score_token_ids(inputs)
    prm.backend = make_attention_backend("flashinfer", prm.device, prm.config, torch.bfloat16)
    got = prm.score_token_ids(inputs)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=2e-2)


def test_varlen_no_cache_batch_equals_per_row():
    """PRM-style batches (no KV cache, several rows) on the torch backend: the one-kernel
    varlen path equals one causal SDPA per row."""
    from specscale.engine.torch.attention.backends import TorchAttentionBackend, varlen_usable
    from specscale.engine.torch.attention.batch import AttentionBatch

    batch = AttentionBatch.from_rows([BatchRow(list(range(n))) for n in (37, 5, 130)], device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    t = batch.num_tokens
    q = torch.randn(t, 8, 128, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(t, 2, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    if not varlen_usable(q):
        pytest.skip("this torch has no torch.nn.attention.varlen")
    on, off = TorchAttentionBackend(), TorchAttentionBackend(use_varlen=False)
    got = on.forward(q, k, v, None, on.plan(batch), 128 ** -0.5)
    want = off.forward(q, k, v, None, off.plan(batch), 128 ** -0.5)
    assert rel(got, want) < 1e-2


@pytest.mark.parametrize("attention", ["torch", "flashinfer"])
def test_cuda_graph_replay_equals_eager(attention):
    if attention == "flashinfer":
        _flashinfer()
    (r,) = runner_pair("Qwen/Qwen2.5-7B-Instruct", [attention])
    r.enable_decode_graphs(max_batch=8)
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate((20, 30, 3)):  # 3 rows -> bucket 4 (one padding row)
        ids = torch.randint(0, r.config.vocab_size, (n,), generator=g).tolist()
        rows.append((ids, list(range(8 * i, 8 * i + 8))))
    b = r.make_batch([BatchRow(ids, 0, t) for ids, t in rows])
    r.forward(b)  # prefill (eager)
    for step in range(6):  # the longest row crosses 32 tokens: torch attention changes page bucket (2 -> 3)
        dec = r.make_batch([BatchRow([7 + step], len(ids), t) for ids, t in rows])
        assert r.graphs.accepts(dec)
        replay = r.graphs.run(dec).clone()
        graphs, r.graphs = r.graphs, None
        eager = r.forward(dec)  # rewrites the same K/V into the same slots
        r.graphs = graphs
        assert rel(replay, eager) < 1e-2, step
        for ids, _ in rows:
            ids.append(7 + step)
    assert r.graphs.replays == 6
    assert r.graphs.num_captured == (2 if attention == "torch" else 1)


@pytest.mark.parametrize("attention", ["torch", "flashinfer"])
def test_logits_equal_transformers(tmp_path, attention):
    if attention == "flashinfer":
        _flashinfer()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specscale.engine.torch.attention.select import make_attention_backend

    torch.manual_seed(0)
    hf_cfg = Qwen2Config(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         rope_theta=1e6, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(hf_cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    model = model.cuda().eval()
    ids = torch.randint(0, 1024, (1, 53))
    with torch.no_grad():
        ref = model(ids.cuda()).logits[0]
    r = ModelRunner(tmp_path, num_blocks=16, dtype=torch.bfloat16, device="cuda")
    r.backend = make_attention_backend(attention, r.device, r.config, r.dtype)
    r.enable_decode_graphs(max_batch=4)
    table = list(range(4))
    b = r.make_batch([BatchRow(ids[0, :50].tolist(), 0, table)])
    ours = r.compute_logits(r.forward(b), b, [0])
    assert rel(ours[0], ref[49]) < 3e-2, "prefill"
    for pos in range(50, 53):  # decode steps, replayed from CUDA graphs
        b = r.make_batch([BatchRow([int(ids[0, pos])], pos, table)])
        ours = r.compute_logits(r.forward(b), b)
        assert rel(ours[0], ref[pos]) < 3e-2, f"decode at {pos}"
    assert r.graphs.replays == 3
