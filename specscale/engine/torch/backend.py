"""The torch backend: the Backend protocol over a real generator and a real PRM.

The scheduler (``GenerationEngine``) owns block ids, refcounts, forks, CD grouping and
sampling; this class turns its ``GenBatch`` into one paged forward of the generator
and returns logits, and turns ``ScoreItem``s into one batched PRM pass. Every call
reports the seconds it took (timed without synchronising: device_timer.py), which
become the generation / verification time on the Server's clock.

Two rules keep runs well-defined at the edges:

* Context window. A path never grows past the generator's window: the engine ends it,
  terminal, when its history fills ``max_model_len`` (``GenerationEngine.max_len``, read
  from this backend). The rule depends on the history length only, so every policy
  sees it identically.
* Identical PRM inputs get identical rewards within a run. Float results of one input
  can differ in the last bits with the batch around it; the search breaks score ties by
  position, so two identical texts must tie exactly. The first rewards computed for a
  token-id prefix are reused for later copies of it (the copies are still computed, so
  measured time does not change); see prm_paths.py.
* PRM inputs are built incrementally, one piece per step (prm_paths.py), and each task
  computes what the PRM prefix-cache plan (specscale/engine/prm_cache.py) says: the
  pieces after its cached ancestor's prefix and the closing tokens, over the PRM's paged
  KV cache (``engine.prm_prefix_cache=true``), or its whole path (false).
* Clock: the Server runs on the wall clock of the whole serving loop (``make_clock``);
  ``forward`` and ``score`` report their time, the rest is host work. Neither call
  synchronises around its work: ``forward`` returns its seconds pending (a
  ``DeviceInterval`` on CUDA), which the generation engine resolves after the sampler's
  copy of the drawn token ids, the iteration's one wait for the device; ``score`` waits
  once, in its single copy of the rewards to the host, and then resolves its seconds.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from specscale.engine.backend import GenBatch, ScoreItem, Seconds, resolve_seconds, score_waves
from specscale.engine.generation import ScheduledBackend
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.runtime.model_runner import ModelRunner, RunnerKVMemory
from specscale.clock import WallClock
from specscale.engine.torch.prm.model import PendingRewards, ProcessRewardModel, read_rewards
from specscale.engine.text.side import TextSide


class TorchServing(ScheduledBackend, RunnerKVMemory):
    """What both torch backends (real and synthetic tokens) share beyond the generator's
    KV: the PRM's KV pool and the wall clock."""

    prm: ProcessRewardModel

    def prm_kv_blocks(self, block_size: int) -> int:
        if self.prm.kv_cache is None:
            raise ValueError("engine.prm_prefix_cache=true but the PRM has no KV pool (ProcessRewardModel.allocate_kv_cache)")
        if block_size != self.prm.block_size:
            raise ValueError(f"the PRM KV cache uses blocks of {self.prm.block_size} tokens, asked for {block_size}")
        return self.prm.num_kv_blocks

    def prm_bytes_per_block(self, block_size: int) -> int:
        return PagedKVCache.bytes_per_block(self.prm.config, block_size, self.runner.dtype)

    def make_clock(self) -> WallClock:
        return WallClock(self.runner.synchronize)

    def attention_paths(self) -> dict[str, Any]:
        """engine=torch's "torch", "cpu_kernel" (with the C kernel's build facts) or "flashinfer"."""
        return {"generator": self.runner.backend.provenance(), "prm": self.prm.backend.provenance()}


class TorchBackend(TorchServing, TextSide):
    def __init__(
        self,
        runner: ModelRunner,
        prm: ProcessRewardModel,
        tokenizer,
        problems: Mapping[int, Any],
    ) -> None:
        self.runner = runner
        self.prm = prm
        cfg = runner.config
        TextSide.__init__(self, tokenizer, prm.tokenizer, prm.format, problems, model_dir=runner.model_dir,
                          max_model_len=runner.max_model_len, vocab_size=cfg.vocab_size,
                          eos_token_id=cfg.eos_token_id, prm_vocab_size=prm.config.vocab_size)

    # ------------------------------------------------------------------ generation
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, Seconds]:
        runner = self.runner

        def work() -> torch.Tensor:
            attn, hidden, want = runner.run_gen_batch(batch)
            if want:
                return runner.compute_logits(hidden, attn, want)
            return torch.empty(0, self.vocab_size, dtype=torch.promote_types(runner.dtype, torch.float32))

        return runner.timed(work)

    # ------------------------------------------------------------------ verification
    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        """Rows are built on the host before the timed call (their cost is the serving
        loop's "other" time); the timed part is the PRM's device work. Every wave is queued
        first; one copy of all rewards to the host is the batch's one wait for the device,
        after which the timing events have completed (resolving them does not wait)."""
        waves = score_waves(items)
        built = [self._paths.rows(wave) for wave in waves]
        prm = self.prm

        def work():
            return [launch_score_wave(prm, wave, rows) for wave, rows in zip(waves, built)]

        pending, interval = self.runner.timed(work)
        per_wave = read_rewards(pending)
        seconds = resolve_seconds(interval)
        by_item = {}
        for wave, rewards in zip(waves, per_wave):
            for it, r in zip(wave, rewards):
                by_item[id(it)] = self._paths.path_rewards(it, r)
        return [by_item[id(it)] for it in items], seconds


def launch_score_wave(prm: Any, wave: Sequence[ScoreItem], rows: Sequence[Any]) -> PendingRewards:
    """One wave of a PRM batch, queued on the device: its copy-on-write copies, then its
    rows. The stream runs the waves in order, so a later wave reads the KV an earlier one
    wrote without the host waiting in between."""
    copies = [cp for it in wave for cp in it.block_copies]
    if copies:
        prm.copy_blocks(copies)
    return prm.launch_rows(rows)
