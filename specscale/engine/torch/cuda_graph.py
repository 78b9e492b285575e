"""Decode iterations replayed from captured CUDA graphs, at bucketed shapes.

A decode iteration of a small batch is launch-bound: ~10 kernels per layer, each a few
microseconds of work. Capturing the decoder body (embeddings -> final norm) once per
bucket and replaying it removes the launch cost; the LM head stays outside (it runs only
on the rows that want logits, and its shape is the vocabulary's).

Buckets: rows R in ``DEFAULT_BUCKETS`` (up to ``max_batch``) times the page width P the
attention backend asks for (``decode_pages_bucket``): FlashInfer plans any lengths on the
host, so one P serves all; the torch backend's plan is a fixed-width gather, so P is the
longest row's pages rounded up to 1, 2, 3, 4, 6, 8, 12, 16, 24, ... A bucket is captured the first time a batch
needs it (``capture_seconds`` adds up the time, which callers leave out of measured
iteration time, as warm-up). Each bucket holds a ``StaticDecode`` (buffers + plan); ``run``
pads the batch into it, replays, and returns the first n rows of the static output.

Graphs share one memory pool: a graph's output is valid until the next replay, which is
how the runner uses it (logits are computed from it before the next forward). Padding rows
use one scratch block at the end of the KV pool that the scheduler never sees
(``ModelRunner.allocate_kv_cache(..., scratch_block=True)``).

``replay="eager"`` runs the same static-buffer path without capturing (any device): it is
how the bucketing, padding and static plans are tested on machines without CUDA.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specscale.engine.torch.attention_batch import AttentionBatch
from specscale.engine.torch.static_decode import StaticDecode, decode_pages

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
REPLAY_MODES = ("cuda", "eager")


@dataclass
class _Bucket:
    static: StaticDecode
    run_body: Callable[[], torch.Tensor]  # the decoder body over the static buffers
    graph: "torch.cuda.CUDAGraph | None" = None
    out: torch.Tensor | None = None  # the graph's static output

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            return self.run_body()
        self.graph.replay()
        return self.out


class DecodeGraphs:
    def __init__(self, runner, buckets=DEFAULT_BUCKETS, max_batch: int = 256, replay: str = "cuda"):
        if replay not in REPLAY_MODES:
            raise ValueError(f"replay={replay!r}: choose one of {REPLAY_MODES}")
        if replay == "cuda" and runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device (replay='eager' runs the same path without them)")
        if runner.scratch_block is None:
            raise ValueError("decode graphs need a scratch KV block (allocate_kv_cache(..., scratch_block=True))")
        self.runner, self.replay_mode = runner, replay
        self.buckets = sorted(b for b in buckets if b <= max_batch)
        if not self.buckets:
            raise ValueError(f"no row bucket <= max_batch={max_batch}")
        self.max_pages = -(-runner.max_model_len // runner.block_size)
        self.pool = torch.cuda.graph_pool_handle() if replay == "cuda" else None
        self._captured: dict[tuple[int, int], _Bucket] = {}
        self.capture_seconds = 0.0
        self.replays = 0  # decode iterations served from a bucket

    @property
    def num_captured(self) -> int:
        return len(self._captured)

    def row_bucket(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def key(self, batch: AttentionBatch) -> tuple[int, int] | None:
        """(rows, pages) bucket of a batch, or None when it runs eagerly (prefill rows,
        no KV cache, more rows than the largest bucket, a gather too large to pad)."""
        if not batch.uses_kv_cache or batch.max_query_len != 1:
            return None
        rows = self.row_bucket(batch.num_rows)
        if rows is None:
            return None
        pages = self.runner.backend.decode_pages_bucket(
            decode_pages(batch), self.max_pages, rows, self.runner.block_size
        )
        return None if pages is None else (rows, pages)

    def accepts(self, batch: AttentionBatch) -> bool:
        return self.key(batch) is not None

    def _on_device(self):
        """Capture and replay use the current CUDA device's streams: make it the runner's."""
        return torch.cuda.device(self.runner.device) if self.replay_mode == "cuda" else contextlib.nullcontext()

    @torch.inference_mode()
    def run(self, batch: AttentionBatch, key: tuple[int, int] | None = None) -> torch.Tensor:
        """The batch's final hidden states from its bucket's graph (``key``: its bucket,
        when the caller already has it from ``key()``)."""
        key = key or self.key(batch)
        if key is None:
            raise ValueError("this batch has no decode bucket (check accepts() first)")
        with self._on_device():
            bucket = self._captured.get(key) or self._capture(*key)
            bucket.static.load(batch, self.runner.scratch_block)
            self.replays += 1
            return bucket.replay()[: batch.num_rows]

    def _capture(self, rows: int, pages: int) -> _Bucket:
        if self.replay_mode == "cuda":
            # Work queued before this call (the iteration's block copies, input uploads)
            # finishes here, not inside the capture window counted as warm-up.
            torch.cuda.synchronize(self.runner.device)
        t0 = time.perf_counter()
        runner = self.runner
        static = runner.backend.static_decode(rows, pages, runner.block_size, runner.device)
        static.load(None, runner.scratch_block)  # all padding: warm-up touches the scratch block only

        def run_body() -> torch.Tensor:
            return runner.model(static.input_ids, static.positions, runner.backend, static.plan(), runner.kv_cache)

        bucket = _Bucket(static, run_body)
        if self.replay_mode == "cuda":
            dev = runner.device
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (lazy inits, kernel autotuning)
                    run_body()
            torch.cuda.current_stream(dev).wait_stream(stream)
            bucket.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(bucket.graph, pool=self.pool):
                bucket.out = run_body()
            torch.cuda.synchronize(dev)
        self._captured[(rows, pages)] = bucket
        self.capture_seconds += time.perf_counter() - t0
        return bucket
