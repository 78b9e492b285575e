"""Decode iterations replayed from captured CUDA graphs, at bucketed shapes.

A decode iteration of a small batch is launch-bound: ~10 kernels per layer, each a few
microseconds of work. Capturing the decoder body (embeddings -> final norm) once per
bucket and replaying it removes the launch cost; the LM head stays outside (it runs only
on the rows that want logits, and its shape is the vocabulary's).

Buckets: rows R in ``DEFAULT_BUCKETS`` (up to ``max_batch``) times the page width P the
attention backend asks for (``decode_pages_bucket``): FlashInfer plans any lengths on the
host, so one P serves all; the torch backend's plan is a fixed-width gather, so P is the
longest row's pages rounded up to 1, 2, 3, 4, 6, 8, 12, 16, 24, ...

Warm-up (docs/design.md §6): every bucket a run can use is captured before serving starts
(``capture_all``, called by ``ModelRunner.warm_up`` from build with the run's longest
context), so measured iteration time never contains a capture and nothing is subtracted
from it. A bucket that was not captured beforehand (a run that outgrows what it was
warmed for, or a ``max_graphs`` cap) is captured when first needed, with a warning naming
it; that capture is part of the iteration's measured time (``lazy_captures``).
``capture_seconds`` adds up all capture time, as a reported figure.

Each bucket holds a ``StaticDecode`` (buffers + plan); ``run`` pads the batch into it,
replays, and returns the first n rows of the static output.

Graphs share one memory pool: a graph's output is valid until the next replay, which is
how the runner uses it (logits are computed from it before the next forward). Padding rows
use one scratch block at the end of the KV pool that the scheduler never sees
(``ModelRunner.allocate_kv_cache(..., scratch_block=True)``).

``replay="eager"`` runs the same static-buffer path without capturing (any device): it is
how the bucketing, padding, static plans and warm-up coverage are tested on machines
without CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specscale.engine.torch.attention.batch import AttentionBatch
from specscale.engine.torch.attention.static_decode import StaticDecode, decode_pages

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
REPLAY_MODES = ("cuda", "eager")
# capture_all captures at most this many graphs by default (in order of likely use); more
# buckets than this means a huge window x many row buckets: the rest are captured on use.
MAX_GRAPHS = 1024

logger = logging.getLogger(__name__)


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
        self.capture_seconds = 0.0  # all capture time (warm-up and lazy), a reported figure
        self.replays = 0  # decode iterations served from a bucket
        self.warmed_pages: int | None = None  # capture_all covered contexts up to this many pages
        self.lazy_captures: list[tuple[int, int]] = []  # buckets captured while serving (after capture_all)
        self.lazy_capture_seconds = 0.0  # their capture time, inside measured iterations

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

    def buckets_for(self, max_pages: int | None = None) -> list[tuple[int, int]]:
        """Every (rows, pages) bucket a decode batch can land in when no row's context
        exceeds ``max_pages`` pages (None: the model window), in order of likely use:
        short contexts first (every sequence passes through them), then fewer rows."""
        max_pages = self.max_pages if max_pages is None else min(int(max_pages), self.max_pages)
        bucket = self.runner.backend.decode_pages_bucket
        keys = set()
        for rows in self.buckets:
            for p in range(1, max_pages + 1):
                width = bucket(p, self.max_pages, rows, self.runner.block_size)
                if width is not None:
                    keys.add((rows, width))
        return sorted(keys, key=lambda k: (k[1], k[0]))

    @torch.inference_mode()
    def capture_all(self, max_pages: int | None = None, max_graphs: int | None = MAX_GRAPHS) -> tuple[int, float]:
        """Capture, before serving, every bucket that decode batches whose rows read at
        most ``max_pages`` KV pages can use (None: the model window); already captured
        ones are kept. ``max_pages`` = ceil(longest context the run can reach /
        block_size). At most ``max_graphs`` new captures, in order of likely use
        (``buckets_for``); a bucket left out is captured when first used, with a warning,
        and its capture time is charged to that iteration. Returns (graphs captured by
        this call, their seconds)."""
        max_pages = self.max_pages if max_pages is None else max(1, min(int(max_pages), self.max_pages))
        todo = [k for k in self.buckets_for(max_pages) if k not in self._captured]
        left_out: list[tuple[int, int]] = []
        if max_graphs is not None and len(todo) > max_graphs:
            todo, left_out = todo[:max_graphs], todo[max_graphs:]
        t0, before = time.perf_counter(), self.capture_seconds
        with self._on_device():
            for rows, pages in todo:
                self._capture(rows, pages)
        seconds = self.capture_seconds - before
        self.warmed_pages = max(self.warmed_pages or 0, max_pages)
        logger.info(
            "decode graphs (%s): %d buckets captured in %.2f s (%.2f s wall) for contexts up to %d pages "
            "(%d tokens), %d in all", self.replay_mode, len(todo), seconds, time.perf_counter() - t0,
            max_pages, max_pages * self.runner.block_size, self.num_captured,
        )
        if left_out:
            logger.warning(
                "decode graphs: %d buckets exceed max_graphs=%d and are not captured before serving "
                "(first: rows x pages %s); each is captured on first use and its capture time is "
                "charged to that iteration", len(left_out), max_graphs, left_out[0],
            )
        return len(todo), seconds

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
            bucket = self._captured.get(key)
            if bucket is None:
                bucket = self._capture_while_serving(*key)
            bucket.static.load(batch, self.runner.scratch_block)
            self.replays += 1
            return bucket.replay()[: batch.num_rows]

    def _capture_while_serving(self, rows: int, pages: int) -> _Bucket:
        """A bucket first needed by a served batch: captured now, inside the measured
        iteration (honest: nothing is subtracted). After capture_all it is a coverage gap."""
        t0 = time.perf_counter()
        bucket = self._capture(rows, pages)
        if self.warmed_pages is not None:
            seconds = time.perf_counter() - t0
            self.lazy_captures.append((rows, pages))
            self.lazy_capture_seconds += seconds
            logger.warning(
                "decode graph bucket rows=%d x pages=%d (%d tokens) was not captured before serving "
                "(warm-up covered %d pages); captured now in %.3f s, charged to this iteration",
                rows, pages, pages * self.runner.block_size, self.warmed_pages, seconds,
            )
        return bucket

    def _capture(self, rows: int, pages: int) -> _Bucket:
        if self.replay_mode == "cuda":
            # Work queued before this call (the iteration's block copies, input uploads)
            # finishes here, not inside the capture window.
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
