"""What the synthetic workload decides, shared by every backend that serves it
(``engine=sim`` and the torch backend's synthetic-token mode): token ids and stop sets,
prompts, PRM input lengths, step rewards, answers and their equivalence. The backends
differ only in how they spend (model) or measure (run) the time."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from specscale.engine.backend import ScoreItem
from specscale.engine.synthetic.problems import SimProblem
from specscale.engine.synthetic.workload import DELIMITER, EOS, SyntheticWorkload


TEMPLATE_KEY = 0x7E3A_1A7E  # seeds the shared template's token ids


class SyntheticOutcomes:
    def __init__(
        self,
        workload: SyntheticWorkload,
        problems: Mapping[int, SimProblem],
        prm_prompt_overhead_tokens: int,
        prm_tokens_per_step: int,
        prm_closing_tokens: int = 0,
    ) -> None:
        self.workload = workload
        self.problems = dict(problems)
        self.prm_overhead = int(prm_prompt_overhead_tokens)
        self.prm_per_step = int(prm_tokens_per_step)
        self.prm_closing_tokens = int(prm_closing_tokens)
        self.vocab_size = workload.vocab_size
        self.eos_ids = frozenset({EOS})
        self.delimiter_ids = frozenset({DELIMITER})

    def prompt_tokens(self, problem: SimProblem) -> list[int]:
        """The generator's prompt: the template (one token sequence shared by every
        problem, so the prefix cache shares its KV across requests) then the question."""
        return self.workload.prompt_tokens(TEMPLATE_KEY, problem.template_tokens) + self.question_tokens(problem)

    def logits_for(self, seqs) -> Any:
        """The workload's next-token logits of each sequence; its problem's key travels
        when the token law depends on the problem (its determined share, its solution length)."""
        keys = None
        if self.workload.p.per_problem_text:
            keys = [self.problems[s.members[0].request_id].key for s in seqs]
        return self.workload.logits_for(seqs, keys)

    def question_tokens(self, problem: SimProblem) -> list[int]:
        """The question alone: what the PRM's prompt holds of it."""
        return self.workload.prompt_tokens(problem.key, problem.prompt_tokens)

    def prm_path_tokens(self, c: Any) -> int:
        """PRM prefix length of a candidate's path: format tokens, the question, and each step
        followed by its separator tokens (the root: the head alone). The closing tokens
        (``prm_closing_tokens``) come after it in every task's input."""
        prompt = self.problems[c.request_id].prompt_tokens
        return self.prm_overhead + prompt + c.path_tokens + self.prm_per_step * (c.round + 1)

    def rewards(self, items: Sequence[ScoreItem]) -> list[list[float]]:
        """Per-step PRM rewards of each item's path."""
        return [[] if it.prefix_only else
                self.workload.step_rewards(it.candidate.path(), *self._problem_of(it.candidate))
                for it in items]

    def _problem_of(self, c: Any) -> tuple[float, int]:
        """(difficulty, key) of a candidate's problem: what its latent fate depends on."""
        p = self.problems[c.request_id]
        return p.difficulty, p.key

    def answer(self, c: Any) -> str | None:
        p = self.problems[c.request_id]
        return self.workload.answer(c.path(), p.difficulty, p.key, p.answer)

    def equivalent(self, a: Any, b: Any) -> bool:
        return a is not None and b is not None and str(a) == str(b)
