"""Tensor-level entry point for the scheduler: one generator model + its paged KV cache.

Per engine iteration the caller
  1. describes the rows to run (``BatchRow``: new tokens, cached length, block table),
  2. ``batch = runner.make_batch(rows)``     (builds AttentionBatch; checks in debug mode),
  3. ``hidden = runner.forward(batch)``      (writes K/V into the cache, [T, hidden]),
  4. ``logits = runner.compute_logits(hidden, batch, rows_to_sample)``.
Block allocation, refcounts and forks stay with the caller; for a copy-on-write
of a shared partial block it calls ``runner.copy_block(src, dst)`` before the
forward that writes into ``dst``.

Before serving, build calls ``runner.warm_up(max_context, prefill_tokens)``: the op set
``engine.fused_ops`` asks for (compiled now when on), decode graphs for every bucket the
run can use and one dummy prefill of the largest iteration (allocator warm-up). ``timed``
then measures serving work as it is: nothing is subtracted from it (docs/design.md §6), and it
never synchronises (device_timer.py): the one wait per engine iteration is the caller's
read of its results.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch

from specscale.engine.backend import Seconds
from specscale.engine.torch.attention.backends import AttentionBackend, TorchAttentionBackend
from specscale.engine.torch.attention.batch import AttentionBatch, BatchRow, BatchBuilder, debug_checks_default
from specscale.engine.torch.model_config import ModelConfig, load_model_config
from specscale.engine.torch.runtime.device_timer import DeviceTimer
from specscale.engine.torch.model.fused_ops import FusedOps, warm_forwards
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.model.loader import load_model, random_model

LOAD_FORMATS = ("auto", "checkpoint", "random")
T = TypeVar("T")


class ModelRunner:
    def __init__(
        self,
        model_dir: str | Path | None,
        *,
        num_blocks: int = 512,
        block_size: int = 16,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str = "cpu",
        attention_backend: AttentionBackend | None = None,
        config: ModelConfig | None = None,
        load_format: str = "auto",
        seed: int = 0,
        debug_checks: bool | None = None,
        fused_ops: bool | FusedOps = False,
    ):
        """debug_checks: per-token and per-block checks of every batch (engine.debug_checks;
        None: $SPECSCALE_DEBUG_CHECKS, which the tests set); ``check_rows`` always checks.
        fused_ops: engine.fused_ops (a ``FusedOps`` shared with the PRM, or a bool); the
        compiled ops are installed and compiled by ``warm_up``, eager until then.
        load_format: "auto" reads the checkpoint's weights; "random" builds ``config``
        (or the checkpoint's config.json) with random weights and needs no weight files."""
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"unknown load_format {load_format!r}; expected one of {LOAD_FORMATS}")
        self.model_dir = Path(model_dir) if model_dir is not None else None
        if config is None:
            if self.model_dir is None:
                raise ValueError("ModelRunner needs a checkpoint directory or a ModelConfig")
            config = load_model_config(self.model_dir)
        self.config = config
        if self.config.kind != "causal_lm":
            raise ValueError(
                f"{self.model_dir} holds a {self.config.architecture}, not a generator; "
                "load it with ProcessRewardModel"
            )
        self.device = torch.device(device)
        self.timer = DeviceTimer(self.device)
        if load_format == "random":
            self.model = random_model(self.config, dtype=dtype, device=self.device, seed=seed)
        else:
            self.model = load_model(self.model_dir, dtype=dtype, device=self.device, config=self.config)
        self.dtype = self.model.model.embed_tokens.weight.dtype
        self.model.model.rotary.table(self.device, self.dtype)  # built now, not in a served forward
        self.fused_ops = fused_ops if isinstance(fused_ops, FusedOps) else FusedOps(bool(fused_ops))
        self.block_size = block_size
        self.kv_cache = PagedKVCache.for_model(self.config, num_blocks, block_size, self.dtype, self.device)
        self.backend = attention_backend or TorchAttentionBackend()
        self.scratch_block: int | None = None  # hidden last block (CUDA-graph padding rows)
        self.builder = BatchBuilder(
            block_size, self.device, max_positions=self.max_model_len, vocab_size=self.config.vocab_size,
            num_blocks=self.num_blocks, debug_checks=debug_checks_default() if debug_checks is None else debug_checks,
        )
        self.graphs = None  # DecodeGraphs, once captured
        self.warmup_seconds = 0.0  # time spent in warm_up (before serving; a reported figure)
        self.memory_plan = None  # MemoryPlan of the KV pools (set by build, see memory_plan.py)
        self._warm_prefill_tokens = 0  # largest dummy prefill run by warm_up

    def allocate_kv_cache(self, num_blocks: int, scratch_block: bool = False) -> None:
        """Replace the KV cache by one of ``num_blocks`` blocks (sized after the weights
        are loaded, from the memory they left free). Its contents are not kept.
        scratch_block: one more block at the end, never handed to the scheduler
        (``num_blocks`` does not count it), for CUDA-graph padding rows."""
        self.graphs = None  # captured against the old pool
        self.kv_cache = None  # release the old pool before allocating the new one
        total = num_blocks + (1 if scratch_block else 0)
        self.kv_cache = PagedKVCache.for_model(self.config, total, self.block_size, self.dtype, self.device)
        self.scratch_block = num_blocks if scratch_block else None
        self.builder.num_blocks = self.num_blocks

    def enable_decode_graphs(self, max_batch: int = 256, replay: str = "cuda") -> None:
        """Serve decode batches from graphs per (rows, pages) bucket (see cuda_graph.py),
        captured by ``warm_up`` before serving (a bucket it did not cover: on first use).
        replay="cuda" captures CUDA graphs (CUDA only); "eager" runs the same fixed-shape
        path without graphs (tests on any device)."""
        from specscale.engine.torch.runtime.cuda_graph import DecodeGraphs

        if self.scratch_block is None:
            self.allocate_kv_cache(self.num_blocks, scratch_block=True)
        self.graphs = DecodeGraphs(self, max_batch=max_batch, replay=replay)

    def warm_up(
        self, max_context: int | None = None, prefill_tokens: int | None = None, logit_rows: int | None = None
    ) -> float:
        """One-time work that must not be charged to serving, done before the clock starts:
        (0) the op set ``fused_ops`` asks for (compiled ops: compiled now, by forwards at
        every shape class; decode graphs captured with the other set are dropped and captured
        again); (1) with decode graphs, capture every bucket that decode batches whose
        contexts stay within ``max_context`` tokens (None: the model window) can use; (2) one dummy
        forward of ``prefill_tokens`` new tokens (the engine's largest iteration,
        engine.max_num_batched_tokens; None: skipped) with the logits of ``logit_rows`` of its
        tokens (engine.max_num_seqs; None: one per row), so the caching allocator
        and first-call kernel setup are warm. The dummy writes K/V into blocks the scheduler
        has not handed out yet (stale contents are overwritten before they are read).
        Idempotent: a second call does only what the first did not cover. Returns the
        seconds spent (also added to ``warmup_seconds``)."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            if self.fused_ops.apply(self.model.model, self._warm_forwards) and self.graphs is not None:
                from specscale.engine.torch.runtime.cuda_graph import DecodeGraphs

                old = self.graphs
                self.graphs = DecodeGraphs(self, old.buckets, max_batch=max(old.buckets), replay=old.replay_mode)
            if prefill_tokens and prefill_tokens > self._warm_prefill_tokens:
                self.dummy_prefill(int(prefill_tokens), logit_rows)
                self._warm_prefill_tokens = int(prefill_tokens)
            if self.graphs is not None:
                ctx = self.max_model_len if max_context is None else min(int(max_context), self.max_model_len)
                self.graphs.capture_all(max_pages=-(-max(ctx, 1) // self.block_size))
        self.synchronize()
        seconds = time.perf_counter() - t0
        self.warmup_seconds += seconds
        return seconds

    def _warm_forwards(self) -> None:
        warm_forwards(self.model, self.backend, self.device, self.config)

    def dummy_prefill_rows(self, tokens: int, first_block: int = 0) -> list[BatchRow]:
        """Rows of a prefill of ``tokens`` new tokens in all (rows within the model window,
        whole blocks but the last), on consecutive blocks from ``first_block``: they use
        ceil(tokens / block_size) blocks. In-vocabulary token ids."""
        g = torch.Generator().manual_seed(0)
        rows, block = [], first_block
        row_cap = max(self.max_model_len // self.block_size * self.block_size, 1)
        while tokens > 0:
            n = min(tokens, row_cap)
            blocks = -(-n // self.block_size)
            ids = torch.randint(0, self.config.vocab_size, (n,), generator=g).tolist()
            rows.append(BatchRow(ids, 0, list(range(block, block + blocks))))
            block += blocks
            tokens -= n
        return rows

    @torch.inference_mode()
    def dummy_prefill(self, tokens: int, logit_rows: int | None = None) -> None:
        """One forward of ``tokens`` new tokens over the KV pool's first blocks (capped by
        the pool), then the logits of ``logit_rows`` of its tokens (None: each row's last)."""
        tokens = min(tokens, self.num_blocks * self.block_size)  # a tiny pool caps it
        if tokens < 1:
            return
        batch = self.make_batch(self.dummy_prefill_rows(tokens))
        hidden = self.forward(batch)
        if logit_rows:
            logits = self.model.compute_logits(hidden[: min(int(logit_rows), hidden.shape[0])])
            logits.to(torch.promote_types(logits.dtype, torch.float32))
        else:
            self.compute_logits(hidden, batch)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks - (1 if self.scratch_block is not None else 0)

    @property
    def max_model_len(self) -> int:
        return self.config.max_position_embeddings

    def check_rows(self, rows: Sequence[BatchRow]) -> None:
        """Context window, token ids and block-id range, checked on the host before any kernel runs."""
        AttentionBatch.from_rows(
            rows, block_size=self.block_size, device=self.device, max_positions=self.max_model_len,
            vocab_size=self.config.vocab_size, num_blocks=self.num_blocks,
        )

    def make_batch(self, rows: Sequence[BatchRow]) -> AttentionBatch:
        """AttentionBatch for this model and cache; the per-token and per-block checks of
        ``check_rows`` run in debug mode only (``debug_checks``)."""
        return self.builder.from_rows(rows)

    @torch.inference_mode()
    def forward(self, batch: AttentionBatch) -> torch.Tensor:
        """Run all rows; returns final-norm hidden states [T, hidden] in flat token order."""
        if batch.uses_kv_cache and batch.block_size != self.block_size:
            raise ValueError(f"batch built for block_size {batch.block_size}, cache has {self.block_size}")
        if batch.max_context_len > self.max_model_len:
            raise ValueError(
                f"batch reaches {batch.max_context_len} tokens, beyond the context window "
                f"max_position_embeddings={self.max_model_len}"
            )
        key = self.graphs.key(batch) if self.graphs is not None else None
        if key is not None:
            return self.graphs.run(batch, key)
        plan = self.backend.plan(batch)
        cache = self.kv_cache if batch.uses_kv_cache else None
        return self.model(batch.input_ids, batch.positions, self.backend, plan, cache)

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, batch: AttentionBatch, row_indices: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Logits of the last new token of each row in ``row_indices`` (all rows if None),
        [len(rows), vocab], at least float32 (float64 stays float64)."""
        n = batch.num_rows
        if hidden.shape[0] == n and (row_indices is None or list(row_indices) == list(range(n))):
            last = hidden  # one new token per row, every row wanted (a decode batch): no gather
        else:
            last = hidden.index_select(0, batch.last_token_indices(row_indices))
        logits = self.model.compute_logits(last)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def copy_block(self, src: int | Sequence[int], dst: int | Sequence[int]) -> None:
        self.kv_cache.copy_block(src, dst)

    def synchronize(self) -> None:
        """Wait for queued device work (for wall-clock timing)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, work: Callable[[], T]) -> tuple[T, Seconds]:
        """``work()`` and its duration, nothing subtracted: warm-up happens before serving
        (``warm_up``); a decode graph captured lazily inside ``work`` is part of its time (and
        logged as a coverage gap). No synchronisation: on CUDA the duration is a
        ``DeviceInterval`` of two timing events, resolved (``resolve_seconds``) after the
        caller's own read of the results; on the CPU a float (device_timer.py)."""
        return self.timer.time(work)

    def run_gen_batch(self, batch) -> tuple[AttentionBatch, torch.Tensor, list[int]]:
        """One generation iteration of the scheduler (a `GenBatch`): perform its
        copy-on-write block copies, then one forward over every row. Returns the
        attention batch, the hidden states and the indices of rows that want logits."""
        if batch.block_copies:
            src, dst = zip(*batch.block_copies)
            self.copy_block(list(src), list(dst))
        rows = batch.rows
        attn = self.builder.gen_batch(batch)
        hidden = self.forward(attn)
        return attn, hidden, [i for i, r in enumerate(rows) if r.wants_logits]


class RunnerKVMemory:
    """The Backend protocol's memory methods for backends serving a ``ModelRunner``
    (``self.runner``): the scheduler's pool is the runner's paged KV cache."""

    runner: ModelRunner

    def kv_blocks(self, block_size: int) -> int:
        if block_size != self.runner.block_size:
            raise ValueError(f"the KV cache uses blocks of {self.runner.block_size} tokens, asked for {block_size}")
        return self.runner.num_blocks

    def bytes_per_block(self, block_size: int) -> int:
        return PagedKVCache.bytes_per_block(self.runner.config, block_size, self.runner.dtype)
