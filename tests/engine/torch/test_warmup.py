"""Warm-up happens before the clock starts, and nothing is subtracted afterwards (docs/design.md §6).

On CPU the decode graphs run with replay="eager": the same bucketing and the same
capture bookkeeping as on CUDA, without capture. After ``warm_up`` every decode batch
the run can make lands in an already captured bucket; ``timed`` reports the whole wall
time of its work, a lazily captured bucket included. The CUDA capture is checked on a GPU.
"""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.engine.torch import build as torch_build
from specscale.engine.torch.attention.batch import BatchRow
from specscale.engine.torch.runtime.cuda_graph import DecodeGraphs
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.settings import CellSpec

MAX_BATCH = 16  # row buckets 1, 2, 4, 8, 16
NUM_BLOCKS = 64


@pytest.fixture
def runner(tiny):
    r = ModelRunner(tiny["qwen2"], num_blocks=NUM_BLOCKS, dtype=torch.float32)
    r.enable_decode_graphs(max_batch=MAX_BATCH, replay="eager")
    return r


def decode_batch(runner, rows: int, context: int):
    """``rows`` decode rows, the longest with ``context`` tokens (new one included)."""
    lens = [context] + [max(1, context - 7 * i) for i in range(1, rows)]
    # Rows share their earlier blocks (only shapes matter here); each writes its own last one.
    tables = [list(range(math.ceil(n / runner.block_size) - 1)) + [40 + i] for i, n in enumerate(lens)]
    return runner.make_batch([BatchRow([5], n - 1, t) for n, t in zip(lens, tables)])


def contexts_up_to(max_context: int, block_size: int):
    """A grid of contexts: both ends of every page count up to max_context."""
    out = set()
    for p in range(1, math.ceil(max_context / block_size) + 1):
        out.update({(p - 1) * block_size + 1, min(p * block_size, max_context)})
    return sorted(out)


def test_after_warm_up_serving_captures_nothing(runner):
    max_context = 300  # 19 pages of 16
    seconds = runner.warm_up(max_context)
    graphs: DecodeGraphs = runner.graphs
    assert seconds > 0 and runner.warmup_seconds == pytest.approx(seconds)
    assert graphs.warmed_pages == 19
    captured = graphs.num_captured
    assert captured == len(graphs.buckets_for(19)) > 0
    replays, i = 0, 0
    for rows in range(1, MAX_BATCH + 1):
        for ctx in contexts_up_to(max_context, runner.block_size):
            batch = decode_batch(runner, rows, ctx)
            key = graphs.key(batch)
            assert key is not None and key in graphs._captured, (rows, ctx)
            i += 1
            if i % 29 == 1:  # serve a sample of the grid (each forward costs)
                runner.forward(batch)
                replays += 1
    assert graphs.num_captured == captured
    assert graphs.lazy_captures == [] and graphs.lazy_capture_seconds == 0.0
    assert graphs.replays == replays


def test_warm_up_is_idempotent_and_extends(runner):
    runner.warm_up(100)
    graphs = runner.graphs
    n = graphs.num_captured
    runner.warm_up(100)
    assert graphs.num_captured == n  # nothing new
    runner.warm_up(400)  # a longer context: only the buckets it adds
    assert graphs.num_captured == len(graphs.buckets_for(25)) > n
    assert graphs.warmed_pages == 25


def test_warm_up_default_is_the_window(runner):
    runner.warm_up()
    graphs = runner.graphs
    assert graphs.warmed_pages == graphs.max_pages == math.ceil(runner.max_model_len / runner.block_size)
    assert graphs.num_captured == len(graphs.buckets_for())


def test_a_bucket_missed_by_warm_up_is_captured_on_use_with_a_warning(runner, caplog):
    runner.warm_up(64)  # 4 pages
    graphs = runner.graphs
    n = graphs.num_captured
    with caplog.at_level(logging.WARNING, logger="specscale.engine.torch.runtime.cuda_graph"):
        runner.forward(decode_batch(runner, 3, 100))  # 7 pages -> bucket (4, 8)
    assert graphs.num_captured == n + 1
    assert graphs.lazy_captures == [(4, 8)]
    assert "rows=4 x pages=8" in caplog.text and "charged to this iteration" in caplog.text


def test_timed_subtracts_nothing(runner, monkeypatch):
    """A lazily captured bucket's capture time is part of the measured iteration."""
    slow = 0.2
    capture = DecodeGraphs._capture

    def slow_capture(self, rows, pages):
        time.sleep(slow)
        return capture(self, rows, pages)

    monkeypatch.setattr(DecodeGraphs, "_capture", slow_capture)
    batch = decode_batch(runner, 2, 40)
    _, seconds = runner.timed(lambda: runner.forward(batch))
    assert runner.graphs.num_captured == 1
    assert seconds >= slow  # an implementation subtracting capture time would report ~0
    _, again = runner.timed(lambda: runner.forward(batch))
    assert again < slow  # captured now: no capture inside


def test_timed_is_the_wall_time_of_work(runner):
    _, seconds = runner.timed(lambda: time.sleep(0.05))
    assert 0.05 <= seconds < 1.0


def test_dummy_prefill_rows_fit_the_pool(tiny):
    r = ModelRunner(tiny["qwen2"], num_blocks=200, dtype=torch.float32)
    window = r.max_model_len
    rows = r.dummy_prefill_rows(2 * window + 37)
    assert [len(x.token_ids) for x in rows] == [window, window, 37]
    blocks = [b for x in rows for b in x.block_table]
    assert blocks == list(range(math.ceil((2 * window + 37) / r.block_size)))
    assert all(0 <= t < r.config.vocab_size for x in rows for t in x.token_ids)
    # The warm-up prefill runs (capped by the pool) and counts as warm-up.
    seconds = r.warm_up(None, prefill_tokens=200 * 16 + 100, logit_rows=8)
    assert r.warmup_seconds == pytest.approx(seconds) and seconds > 0
    assert r.warm_up(None, prefill_tokens=100) < seconds  # already warm: nothing to do


TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=2", "search.temperature=1.0", "search.max_rounds=4", "search.step_token_cap=12",
    "search.path_token_cap=60", "wandb.mode=disabled", "beam=4", "expansion=2", "concurrency=2", "seed=3",
    "policy=full",
]


def test_build_warms_up_for_the_cell_and_serving_captures_nothing():
    """build_torch warms the decode graphs up to the cell's longest context (longest prompt
    + search.path_token_cap); serving the cell then never captures a bucket."""
    cfg = compose_cfg(*TORCH, small=False)
    models = torch_build.build_models(cfg)
    runner = models[0]
    runner.enable_decode_graphs(max_batch=16, replay="eager")  # CPU: the same path, no capture
    backend, problems = torch_build.build_torch(CellSpec.from_config(cfg), models=models)
    longest = max(len(backend.prompt_tokens(p)) for p in problems)
    max_context = min(runner.max_model_len, longest + 60)
    graphs = runner.graphs
    assert graphs.warmed_pages == math.ceil(max_context / runner.block_size)
    captured = graphs.num_captured
    assert captured == len(graphs.buckets_for(graphs.warmed_pages))
    assert runner.warmup_seconds > 0
    rec = build_server(cfg, built=(backend, problems)).run()
    assert graphs.replays >= 20
    assert graphs.num_captured == captured and graphs.lazy_captures == []
    assert rec.leaked_blocks == 0
    # A second cell on the same models: nothing more to capture.
    torch_build.build_torch(CellSpec.from_config(cfg), models=models)
    assert graphs.num_captured == captured


def test_build_synthetic_warms_up_for_its_prompts():
    cfg = compose_cfg(
        "engine=torch", "engine.synthetic_tokens=true", "model=tiny", "engine.dtype=float32", "n_problems=2",
        "search.path_token_cap=96", "engine.cpu_kv_blocks=512", small=True,
    )
    models = torch_build.build_models(cfg)
    runner = models[0]
    runner.enable_decode_graphs(max_batch=8, replay="eager")
    backend, problems = torch_build.build_synthetic(CellSpec.from_config(cfg), models=models)
    longest = max(len(backend.prompt_tokens(p)) for p in problems)
    assert runner.graphs.warmed_pages == math.ceil(min(runner.max_model_len, longest + 96) / runner.block_size)


def test_run_max_context():
    cfg = {"search": {"path_token_cap": 100}}
    assert torch_build.run_max_context(cfg, [10, 40], 1000) == 140
    assert torch_build.run_max_context(cfg, [950], 1000) == 1000  # the window caps it


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_warm_up_captures_every_bucket_before_serving(tiny):
    r = ModelRunner(tiny["qwen2"], num_blocks=NUM_BLOCKS, dtype=torch.float32, device="cuda")
    r.enable_decode_graphs(max_batch=8)
    r.warm_up(200, prefill_tokens=512, logit_rows=8)
    graphs = r.graphs
    n = graphs.num_captured
    assert n == len(graphs.buckets_for(13)) and graphs.capture_seconds > 0
    for rows in (1, 3, 8):
        for ctx in (1, 17, 100, 200):
            r.forward(decode_batch(r, rows, ctx))
    assert graphs.num_captured == n and graphs.lazy_captures == []
