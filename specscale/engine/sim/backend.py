"""The simulated backend: synthetic workload for tokens and scores, cost model for time."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from specscale.engine.backend import GenBatch, ScoreItem
from specscale.engine.sim.cost_model import CostModel
from specscale.engine.sim.problems import SimProblem
from specscale.engine.sim.workload import DELIMITER, EOS, SyntheticWorkload


class SimBackend:
    """Backend protocol on a virtual clock: every duration is modelled."""

    def __init__(
        self,
        workload: SyntheticWorkload,
        cost: CostModel,
        problems: Mapping[int, SimProblem],
        prm_prompt_overhead_tokens: int,
        prm_tokens_per_step: int,
    ) -> None:
        self.workload = workload
        self.cost = cost
        self.problems = dict(problems)
        self.prm_overhead = prm_prompt_overhead_tokens
        self.prm_per_step = prm_tokens_per_step
        self.vocab_size = workload.vocab_size
        self.eos_ids = frozenset({EOS})
        self.delimiter_ids = frozenset({DELIMITER})

    # ------------------------------------------------------------------ generation
    def prompt_tokens(self, problem: SimProblem) -> list[int]:
        return self.workload.prompt_tokens(problem.key, problem.prompt_tokens)

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
        logits = self.workload.logits_for(seqs)
        return logits, seconds

    # ------------------------------------------------------------------ verification
    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        out = []
        for it in items:
            c = it.candidate
            out.append(self.workload.step_rewards(c.path(), self.problems[c.request_id].difficulty))
        return out, self.cost.prm_seconds([(it.n_new, it.n_cached) for it in items])

    def prm_path_tokens(self, c: Any) -> int:
        prompt = self.problems[c.request_id].prompt_tokens
        return self.prm_overhead + prompt + c.path_tokens + self.prm_per_step * (c.round + 1)

    # ------------------------------------------------------------------ answers and memory
    def answer(self, c: Any) -> str | None:
        p = self.problems[c.request_id]
        return self.workload.answer(c.path(), p.difficulty, p.key, p.answer)

    def equivalent(self, a: Any, b: Any) -> bool:
        return a is not None and b is not None and str(a) == str(b)

    def kv_blocks(self, block_size: int) -> int:
        return self.cost.kv_capacity_blocks(block_size)[0]

    def bytes_per_block(self, block_size: int) -> int:
        return self.cost.generator.kv_bytes_per_token(self.cost.dtype_bytes) * block_size
