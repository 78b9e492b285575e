"""The simulated backend: synthetic workload for tokens and scores, cost model for time."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from specscale.engine.backend import GenBatch, ScoreItem, score_waves
from specscale.engine.generation import ScheduledBackend
from specscale.engine.sim.cost_model import CostModel
from specscale.engine.synthetic.problems import SimProblem
from specscale.engine.synthetic.outcomes import SyntheticOutcomes
from specscale.engine.synthetic.workload import SyntheticWorkload
from specscale.clock import VirtualClock


class SimBackend(ScheduledBackend, SyntheticOutcomes):
    """Backend protocol on a virtual clock: every duration is modelled."""

    def __init__(
        self,
        workload: SyntheticWorkload,
        cost: CostModel,
        problems: Mapping[int, SimProblem],
        prm_prompt_overhead_tokens: int,
        prm_tokens_per_step: int,
        prm_closing_tokens: int = 0,
    ) -> None:
        super().__init__(workload, problems, prm_prompt_overhead_tokens, prm_tokens_per_step, prm_closing_tokens)
        self.cost = cost

    def make_clock(self) -> VirtualClock:
        return VirtualClock(self.cost.host_model())

    # ------------------------------------------------------------------ generation
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, float]:
        decode_ctx, prefill, seqs = [], [], []
        for r in batch.rows:
            if r.n_new == 1:
                decode_ctx.append(r.start + 1)
            else:
                prefill.append((r.n_new, r.start))
            if r.wants_logits:
                seqs.append(r.seq)
        seconds = self.cost.generation_seconds(np.asarray(decode_ctx, dtype=np.int64), prefill, len(seqs))
        if not seqs:
            return torch.empty(0, self.vocab_size, dtype=torch.float64), seconds
        logits = self.logits_for(seqs)
        return logits, seconds

    # ------------------------------------------------------------------ verification
    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        seconds = sum(self.cost.prm_seconds([(it.n_new, it.n_cached) for it in wave]) for wave in score_waves(items))
        return self.rewards(items), seconds

    def prm_cost(self, tasks: Sequence[tuple[float, float]]) -> float:
        """Modelled seconds of a PRM batch of (new, cached) token tasks: the PRM cost curve
        that adaptive verification prices a flush with (the same model that times it)."""
        return self.cost.prm_seconds(tasks)

    def prm_cost_groups(self, groups: Sequence[tuple[int, float, float]]) -> float:
        """``prm_cost`` of (count, new, cached) groups of equal tasks."""
        return self.cost.prm_seconds_groups(groups)

    # ------------------------------------------------------------------ memory
    def kv_blocks(self, block_size: int) -> int:
        return self.cost.kv_capacity_blocks(block_size)[0]

    def bytes_per_block(self, block_size: int) -> int:
        return self.cost.generator.kv_bytes_per_token(self.cost.dtype_bytes) * block_size

    def prm_kv_blocks(self, block_size: int) -> int:
        return self.cost.kv_capacity_blocks(block_size)[1]

    def prm_bytes_per_block(self, block_size: int) -> int:
        return self.cost.prm.kv_bytes_per_token(self.cost.dtype_bytes) * block_size
