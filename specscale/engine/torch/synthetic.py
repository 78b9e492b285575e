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
a head of ``prompt_overhead_tokens`` format tokens and the prompt, each step followed by
``tokens_per_step`` separator tokens (the reward is read at the last token of each
step's piece), then ``closing_tokens`` format tokens. They run as the PRM prefix-cache
plan says (prm_paths.py), so PRM input tokens are those the sim counts for the same tree.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from specscale.engine.backend import GenBatch, ScoreItem, Seconds, resolve_seconds, score_waves
from specscale.engine.synthetic.problems import SimProblem
from specscale.engine.synthetic.outcomes import SyntheticOutcomes
from specscale.engine.synthetic.workload import DELIMITER, SyntheticWorkload
from specscale.engine.torch.backend import TorchServing, launch_score_wave
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.text.prm_paths import PRMPaths

FORMAT_TOKEN = DELIMITER  # id filling the PRM's format/separator positions (any in-vocab id would do)


class SyntheticTorchBackend(TorchServing, SyntheticOutcomes):
    def __init__(
        self,
        runner: ModelRunner,
        prm: ProcessRewardModel,
        workload: SyntheticWorkload,
        problems: Mapping[int, SimProblem],
        prm_prompt_overhead_tokens: int,
        prm_tokens_per_step: int,
        prm_closing_tokens: int = 0,
    ) -> None:
        for what, vocab in (("generator", runner.config.vocab_size), ("PRM", prm.config.vocab_size)):
            if vocab < workload.vocab_size:
                raise ValueError(
                    f"synthetic tokens: the workload uses {workload.vocab_size} token ids but the {what} "
                    f"vocabulary has {vocab}; lower engine.synthetic.content_vocab"
                )
        SyntheticOutcomes.__init__(
            self, workload, problems, prm_prompt_overhead_tokens, prm_tokens_per_step, prm_closing_tokens
        )
        self.runner, self.prm = runner, prm
        self._paths = PRMPaths(self._head, self._piece, [FORMAT_TOKEN] * self.prm_closing_tokens,
                               vocab_size=prm.config.vocab_size)
        self.max_model_len = runner.max_model_len

    # ------------------------------------------------------------------ generation
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, Seconds]:
        runner = self.runner

        def work() -> torch.Tensor:
            rows = batch.rows
            attn, hidden, want = runner.run_gen_batch(batch)
            if not want:
                return torch.empty(0, self.vocab_size, dtype=torch.float64)
            runner.compute_logits(hidden, attn, want)  # the real LM head runs (its cost is measured)
            return self.logits_for([rows[i].seq for i in want])

        return runner.timed(work)

    # ------------------------------------------------------------------ verification
    def _head(self, request_id: int) -> list[int]:
        return [FORMAT_TOKEN] * self.prm_overhead + self.question_tokens(self.problems[request_id])

    def _piece(self, c: Any) -> tuple[list[int], int]:
        ids = list(c.step_tokens) + [FORMAT_TOKEN] * self.prm_per_step
        return ids, len(ids) - 1

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        """The PRM runs the planned rows for real (its cost is measured); rewards come from
        the workload. A row past the PRM's window runs uncached on its newest tokens (the
        cost of a full window, never an error: the workload's paths are not bounded by it)."""
        cap = self.prm.max_model_len
        waves = score_waves(items)
        wave_rows = [[r if r.start + len(r.token_ids) <= cap else _window(r, cap) for r in self._paths.rows(w)]
                     for w in waves]
        prm = self.prm

        def work() -> None:
            for wave, rows in zip(waves, wave_rows):
                launch_score_wave(prm, wave, rows)

        # The real rewards are not read (the workload's are returned): waiting for the end
        # event is the batch's one wait for the device, and its work has finished after it.
        _, interval = self.runner.timed(work)
        return self.rewards(items), resolve_seconds(interval)


def _window(row: PRMRow, cap: int) -> PRMRow:
    """The newest ``cap`` tokens of a row's whole input, without the cache (the KV of its
    table is then not written: later rows reading it only get a realistic cost)."""
    ids = list(row.token_ids)[-cap:]
    return PRMRow(ids, 0, None, [len(ids) - 1])
