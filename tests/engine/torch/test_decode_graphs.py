"""Decode graphs on CPU: the fixed-shape bucket path (static buffers, padding rows, the
torch backend's static plan) run with replay="eager" equals the plain eager forward, keeps
every real KV block identical, and leaves the search tree unchanged. The CUDA capture of
the same path is checked on a GPU (test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import assert_same_tree
from specscale.cell import build_server
from specscale.engine.torch.attention.backends import TorchAttentionBackend
from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.runtime.cuda_graph import DecodeGraphs
from specscale.engine.torch.runtime.model_runner import ModelRunner

NUM_BLOCKS = 24


def runners(tiny, name):
    plain = ModelRunner(tiny[name], num_blocks=NUM_BLOCKS, dtype=torch.float64)
    graphed = ModelRunner(tiny[name], num_blocks=NUM_BLOCKS, dtype=torch.float64)
    graphed.enable_decode_graphs(max_batch=8, replay="eager")
    return plain, graphed


def decode_steps(runner, lens, steps, seed=0):
    """Prefill rows of the given lengths (eager), then greedy decode steps; hidden states per step."""
    g = torch.Generator().manual_seed(seed)
    tables = [list(range(6 * i, 6 * i + 6)) for i in range(len(lens))]
    hist = [torch.randint(3, runner.config.vocab_size, (n,), generator=g).tolist() for n in lens]
    b = runner.make_batch([BatchRow(h, 0, t) for h, t in zip(hist, tables)])
    runner.forward(b)
    toks = [h[-1] for h in hist]
    out = []
    for _ in range(steps):
        b = runner.make_batch([BatchRow([t], len(h), tb) for t, h, tb in zip(toks, hist, tables)])
        for h, t in zip(hist, toks):
            h.append(t)
        hidden = runner.forward(b)
        out.append(hidden.clone())
        toks = [int(x) for x in runner.compute_logits(hidden, b).argmax(-1)]
    return out


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_static_decode_equals_eager_and_keeps_kv(tiny, name):
    plain, graphed = runners(tiny, name)
    # 3 rows -> bucket 4 (one padding row); the longest row grows from 31 to 48 tokens,
    # so the page bucket changes (2 pages -> 3) during the run.
    lens, steps = (20, 30, 3), 18
    ref = decode_steps(plain, lens, steps)
    got = decode_steps(graphed, lens, steps)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=0, atol=1e-11), f"step {i}: {(a - b).abs().max():.2e}"
    assert sorted(graphed.graphs._captured) == [(4, 2), (4, 3)]
    # Padding rows wrote into the scratch block only: every schedulable block holds the same
    # K/V (to GEMM round-off: the padded batch has another row count), unused ones still zero.
    assert graphed.scratch_block == NUM_BLOCKS and graphed.num_blocks == NUM_BLOCKS
    used = 6 * len(lens)
    for layer in range(plain.config.num_hidden_layers):
        for ours, theirs in zip(graphed.kv_cache.layer(layer), plain.kv_cache.layer(layer)):
            assert torch.allclose(ours[:NUM_BLOCKS], theirs, rtol=0, atol=1e-11)
            assert not ours[used:NUM_BLOCKS].any()
            assert ours[NUM_BLOCKS].any()  # the scratch block took the padding row's K/V


def test_buckets_and_what_runs_eagerly(tiny):
    _, graphed = runners(tiny, "qwen2")
    graphs: DecodeGraphs = graphed.graphs
    dec = lambda n, ctx: graphed.make_batch([BatchRow([5], ctx - 1, [i]) for i in range(n)])
    assert graphs.key(dec(3, 16)) == (4, 1)
    two = graphed.make_batch([BatchRow([5], 16, [0, 1]), BatchRow([5], 40, [2, 3, 4])])
    assert graphs.key(two) == (2, 3)  # the longest row reads 3 pages
    assert graphs.key(dec(8, 10)) == (8, 1)
    assert graphs.key(dec(9, 10)) is None  # more rows than the largest bucket
    prefill = graphed.make_batch([BatchRow([5, 6], 0, [0])])
    assert not graphs.accepts(prefill)
    nocache = graphed.make_batch([BatchRow([5])])
    assert not graphs.accepts(nocache)
    with pytest.raises(ValueError, match="no decode bucket"):
        graphs.run(prefill)


def test_page_buckets():
    torch_backend = TorchAttentionBackend()
    got = [torch_backend.decode_pages_bucket(p, 64, 4, 16) for p in (1, 2, 3, 4, 5, 7, 9, 13, 33, 49, 64)]
    assert got == [1, 2, 3, 4, 6, 8, 12, 16, 48, 64, 64]
    assert torch_backend.decode_pages_bucket(50, 60, 4, 16) == 60  # capped at the window's pages
    assert torch_backend.decode_pages_bucket(65, 64, 4, 16) is None  # beyond the window
    # A padded gather of more than max_static_keys keys runs eagerly instead.
    assert torch_backend.decode_pages_bucket(2048, 2048, 256, 16) is None


def test_replay_mode_errors(tiny):
    r = ModelRunner(tiny["qwen2"], num_blocks=4, dtype=torch.float64)
    with pytest.raises(ValueError, match="scratch KV block"):
        DecodeGraphs(r, replay="eager")
    r.allocate_kv_cache(4, scratch_block=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(r, replay="cuda")
    with pytest.raises(ValueError, match="replay="):
        DecodeGraphs(r, replay="lazy")


TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=2", "search.temperature=1.0", "search.max_rounds=4", "search.step_token_cap=12",
    "search.path_token_cap=60", "wandb.mode=disabled", "beam=4", "expansion=2", "concurrency=2", "seed=3",
]


@pytest.mark.parametrize("policy", ["nonspec", "full"])
def test_search_tree_unchanged_by_decode_graphs(policy):
    cfg = compose_cfg(*TORCH, f"policy={policy}", small=False)
    plain = build_server(cfg).run()
    server = build_server(cfg)
    runner = server.backend.runner
    runner.enable_decode_graphs(max_batch=16, replay="eager")
    rec = server.run()
    decode_iterations = sum(r["prefill_tokens"] == 0 for r in rec.iterations if r["kind"] == "generate")
    assert runner.graphs.replays >= 20 and runner.graphs.replays >= decode_iterations
    assert_same_tree(rec, plain, f"{policy} with decode graphs", score_tol=1e-9)
    assert rec.leaked_blocks == 0


def test_buckets_for_is_every_bucket_a_context_can_reach(tiny):
    """capture_all's list: exactly the (rows, decode_pages_bucket) pairs of page counts
    1..max_pages, short contexts first; FlashInfer-like backends (one width) give one
    bucket per row count."""
    _, graphed = runners(tiny, "qwen2")
    graphs: DecodeGraphs = graphed.graphs
    keys = graphs.buckets_for(10)
    assert keys == sorted(keys, key=lambda k: (k[1], k[0]))
    want = {(r, graphed.backend.decode_pages_bucket(p, graphs.max_pages, r, graphed.block_size))
            for r in graphs.buckets for p in range(1, 11)}
    assert set(keys) == want
    assert {p for _, p in keys} == {1, 2, 3, 4, 6, 8, 12}
    assert graphs.buckets_for(10 ** 6) == graphs.buckets_for()  # capped at the window

    class OneWidth(TorchAttentionBackend):
        def decode_pages_bucket(self, pages, max_pages, rows, block_size):
            return max_pages if pages <= max_pages else None

    graphed.backend = OneWidth()
    assert graphs.buckets_for(10) == [(r, graphs.max_pages) for r in graphs.buckets]


def test_capture_all_with_a_cap_leaves_the_rest_to_first_use(tiny, caplog):
    _, graphed = runners(tiny, "qwen2")
    graphs: DecodeGraphs = graphed.graphs
    everything = graphs.buckets_for(8)
    with caplog.at_level("WARNING", logger="specscale.engine.torch.runtime.cuda_graph"):
        n, _ = graphs.capture_all(max_pages=8, max_graphs=3)
    assert n == 3 and sorted(graphs._captured) == sorted(everything[:3])
    assert "exceed max_graphs=3" in caplog.text
    n, _ = graphs.capture_all(max_pages=8)  # the rest; the captured ones are kept
    assert n == len(everything) - 3 and graphs.num_captured == len(everything)
