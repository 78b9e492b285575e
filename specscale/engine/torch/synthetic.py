"""Synthetic-token mode (``engine.synthetic_tokens=true``): real forward passes, controlled workload.

The generator and the PRM run their real forwards (paged KV cache, LM head, PRM head)
on the real token history, so every reported duration is a measured engine cost. The
logits handed to the scheduler and the PRM rewards come from the sim's
``SyntheticWorkload`` instead, so tokens, step lengths, scores and answers follow the
workload exactly as on ``engine=sim``: the same seed and workload settings give the
same search tree on both backends.

Token ids: the workload's small id space (EOS=0, delimiter=1, content 2..) is used as
model token ids unchanged (identity map into the model vocabulary, which must be at
least as large). No tokenizer is involved: this is the id path random-weight models
(``model.load_format=random``) run on.

PRM inputs are built from ids with the workload's accounting (as the sim counts them):
``prompt_overhead_tokens`` format tokens, the prompt, and each step followed by
``tokens_per_step`` separator tokens; the reward is read at the last token of each
step's block. Their length is ``SyntheticOutcomes.prm_path_tokens``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from specscale.engine.backend import GenBatch, ScoreItem
from specscale.engine.sim.problems import SimProblem
from specscale.engine.sim.outcomes import SyntheticOutcomes
from specscale.engine.sim.workload import DELIMITER, SyntheticWorkload
from specscale.engine.torch.model_runner import ModelRunner, RunnerKVMemory
from specscale.engine.torch.prm import ProcessRewardModel
from specscale.engine.torch.prm_format import PRMInput

FORMAT_TOKEN = DELIMITER  # id filling the PRM's format/separator positions (any in-vocab id would do)


class SyntheticTorchBackend(RunnerKVMemory, SyntheticOutcomes):
    def __init__(
        self,
        runner: ModelRunner,
        prm: ProcessRewardModel,
        workload: SyntheticWorkload,
        problems: Mapping[int, SimProblem],
        prm_prompt_overhead_tokens: int,
        prm_tokens_per_step: int,
    ) -> None:
        for what, vocab in (("generator", runner.config.vocab_size), ("PRM", prm.config.vocab_size)):
            if vocab < workload.vocab_size:
                raise ValueError(
                    f"synthetic tokens: the workload uses {workload.vocab_size} token ids but the {what} "
                    f"vocabulary has {vocab}; lower engine.synthetic.content_vocab"
                )
        super().__init__(workload, problems, prm_prompt_overhead_tokens, prm_tokens_per_step)
        self.runner, self.prm = runner, prm
        self.max_model_len = runner.max_model_len

    # ------------------------------------------------------------------ generation
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, float]:
        runner = self.runner

        def work() -> torch.Tensor:
            rows = batch.rows
            attn, hidden, want = runner.run_gen_batch(batch)
            if not want:
                return torch.empty(0, self.vocab_size, dtype=torch.float64)
            runner.compute_logits(hidden, attn, want)  # the real LM head runs (its cost is measured)
            return self.workload.logits_for([rows[i].seq for i in want])

        return runner.timed(work)

    # ------------------------------------------------------------------ verification
    def prm_input(self, c: Any) -> PRMInput:
        """The id-level PRM input of a candidate's whole path (see the module docstring)."""
        ids = [FORMAT_TOKEN] * self.prm_overhead + self.prompt_tokens(self.problems[c.request_id])
        positions = []
        for p in c.path():
            ids.extend(p.step_tokens)
            ids.extend([FORMAT_TOKEN] * self.prm_per_step)
            positions.append(len(ids) - 1)
        cap = self.prm.max_model_len
        if len(ids) > cap:  # keep the newest tokens: the cost of a full window, never an error
            cut = len(ids) - cap
            ids = ids[cut:]
            positions = [q - cut for q in positions if q >= cut] or [len(ids) - 1]
        return PRMInput(tuple(ids), tuple(positions))

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        def work() -> list[list[float]]:
            self.prm.score_token_ids([self.prm_input(it.candidate) for it in items])  # real PRM cost
            return self.rewards(items)

        return self.runner.timed(work)
