"""PRM prompt formats: (question, steps) -> token ids + where each step's reward is read.

Two released formats are supported:

* Qwen2.5-Math-PRM: system / user(question) / assistant(steps joined by
  ``<extra_0>``, one after every step); reward read at each ``<extra_0>``.
* RLHFlow Llama3.1-8B PRM: one user turn per step (the first one is
  ``question + " " + step``), each answered by an assistant turn "+"; reward
  read at the position that predicts the assistant's token.

Both render through the checkpoint's own chat template, so a real tokenizer
produces exactly the prompt the PRM was trained on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from specscale.engine.torch.tokenizer import render_chat

QWEN_MATH_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class PRMInput:
    """One path to score: its tokens and, per step, the index of the token whose
    hidden state yields that step's reward."""

    token_ids: tuple[int, ...]
    reward_positions: tuple[int, ...]

    def __post_init__(self):
        n = len(self.token_ids)
        for p in self.reward_positions:
            if not 0 <= p < n:
                raise ValueError(f"reward position {p} outside the {n}-token input")


class PRMFormat(ABC):
    name: str

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @abstractmethod
    def encode(self, question: str, steps: Sequence[str]) -> PRMInput:
        """Render one path; ``steps`` must be non-empty."""

    def _single_token(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{self.name}: {text!r} is not a single token for this tokenizer ({ids})")
        return ids[0]


class QwenMathPRMFormat(PRMFormat):
    name = "qwen_math_prm"

    def __init__(self, tokenizer, system_prompt: str = QWEN_MATH_PRM_SYSTEM, step_token: str = "<extra_0>"):
        super().__init__(tokenizer)
        self.system_prompt = system_prompt
        self.step_token = step_token
        self.step_token_id = self._single_token(step_token)

    def encode(self, question: str, steps: Sequence[str]) -> PRMInput:
        if not steps:
            raise ValueError("a path needs at least one step")
        for i, step in enumerate(steps):
            if self.step_token in step:
                raise ValueError(f"step {i} contains the step separator {self.step_token!r}")
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.step_token.join(steps) + self.step_token},
        ]
        ids = render_chat(self.tokenizer, messages)
        positions = [i for i, t in enumerate(ids) if t == self.step_token_id]
        if len(positions) != len(steps):
            raise ValueError(
                f"found {len(positions)} {self.step_token!r} tokens for {len(steps)} steps "
                "(does the question contain the separator?)"
            )
        return PRMInput(tuple(ids), tuple(positions))


class RLHFlowPRMFormat(PRMFormat):
    name = "rlhflow"

    def __init__(self, tokenizer, plus: str = "+", minus: str = "-"):
        super().__init__(tokenizer)
        self.plus_id = self._single_token(plus)
        self.minus_id = self._single_token(minus)
        self.plus = plus
        # The assistant header as the template renders it (e.g. Llama 3's
        # "<|start_header_id|>assistant<|end_header_id|>\n\n"): the difference
        # between a conversation with and without the generation prompt.
        probe = [{"role": "user", "content": "x"}]
        base = render_chat(tokenizer, probe)
        with_header = render_chat(tokenizer, probe, add_generation_prompt=True)
        if with_header[: len(base)] != base or len(with_header) == len(base):
            raise ValueError("rlhflow: cannot locate the assistant header in this chat template")
        self.header_ids = tuple(with_header[len(base) :])

    def encode(self, question: str, steps: Sequence[str]) -> PRMInput:
        if not steps:
            raise ValueError("a path needs at least one step")
        messages = []
        for i, step in enumerate(steps):
            messages.append({"role": "user", "content": f"{question} {step}" if i == 0 else step})
            messages.append({"role": "assistant", "content": self.plus})
        ids = render_chat(self.tokenizer, messages)
        pattern = list(self.header_ids) + [self.plus_id]
        n = len(pattern)
        # Reward of a step = the position right before its assistant "+" token.
        positions = [i + n - 2 for i in range(len(ids) - n + 1) if ids[i : i + n] == pattern]
        if len(positions) != len(steps):
            raise ValueError(f"found {len(positions)} assistant '+' turns for {len(steps)} steps")
        return PRMInput(tuple(ids), tuple(positions))
