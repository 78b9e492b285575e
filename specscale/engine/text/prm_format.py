"""PRM prompt formats: (question, steps) -> token ids + where each step's reward is read.

Two released formats are supported:

* Qwen2.5-Math-PRM: system / user(question) / assistant(steps joined by
  ``<extra_0>``, one after every step); reward read at each ``<extra_0>``.
* RLHFlow Llama3.1-8B PRM: one user turn per step (the first one is
  ``question + " " + step``), each answered by an assistant turn "+"; reward
  read at the position that predicts the assistant's token.

Both render through the checkpoint's own chat template, so a real tokenizer
produces exactly the prompt the PRM was trained on.

Incremental form (PRM prefix cache): a path's input is
``head_ids(question) + step_piece(0, c0) + ... + step_piece(k-1, ck-1) + closing_ids()``
with ``c = content_ids(step_text)``; ``encode_pieces`` assembles it and is the
canonical PRM input of a path (cache on and cache off compute exactly these ids).
The template literals between pieces (headers, separators, end of turn) are found
once by rendering the template with marker strings at text level, splitting the
text at the markers and tokenizing each literal segment on its own.

Piecewise == whole (``encode``) token for token whenever every piece boundary is a
boundary of the tokenizer's pre-tokenizer: special tokens are split out before
pre-tokenization, and with the Qwen2 / Llama 3 split pattern a boundary before a
space or a letter/digit/punctuation run after "\\n" is one. Known differences:
a first step whose text starts with a line break (Qwen: "assistant\\n" + "\\n..."
merge into one "\\n\\n" pre-token in the whole render), and, for templates that
trim message content (Llama 3 / RLHFlow), whitespace at the ends of steps (each
step's text is stripped piecewise, while the whole render strips only the ends of
each user turn, i.e. not the start of step 1, which follows the question).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from specscale.engine.text.tokenizer import render_chat

# Marker strings: no whitespace at their ends (templates that trim content keep them
# intact) and NUL bytes no real question or step contains.
_MARK = "\x00specscale-{}\x00"
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

    # ---- incremental form (see the module docstring)
    @abstractmethod
    def head_ids(self, question: str) -> list[int]:
        """Token ids before the first step's piece (template preamble + question)."""

    @abstractmethod
    def step_piece(self, index: int, content_ids: Sequence[int]) -> tuple[list[int], int]:
        """(ids step ``index`` adds to the path, offset in them of its reward token)."""

    @abstractmethod
    def closing_ids(self) -> list[int]:
        """Tokens after the last piece that complete a path (never part of a prefix)."""

    def content_ids(self, text: str) -> list[int]:
        """One step's text as PRM token ids (no special tokens added)."""
        return self._tokenize(text)

    def encode_pieces(self, question: str, contents: Sequence[Sequence[int]]) -> PRMInput:
        """The canonical PRM input of a path: head + pieces + closing, absolute reward positions."""
        if not contents:
            raise ValueError("a path needs at least one step")
        ids = self.head_ids(question)
        positions = []
        for i, content in enumerate(contents):
            piece, offset = self.step_piece(i, content)
            positions.append(len(ids) + offset)
            ids.extend(piece)
        ids.extend(self.closing_ids())
        return PRMInput(tuple(ids), tuple(positions))

    # ---- helpers
    def _tokenize(self, text: str) -> list[int]:
        # As render_chat: the literal text already holds any BOS / role markers.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _single_token(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{self.name}: {text!r} is not a single token for this tokenizer ({ids})")
        return ids[0]

    def _render_split(self, messages: list[dict[str, str]], markers: Sequence[str]) -> list[str]:
        """Render ``messages`` (whose contents hold ``markers``) as text and split it at the
        markers, in order: len(markers) + 1 literal segments."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        segments = []
        for m in markers:
            head, sep, text = text.partition(m)
            if not sep or m in text:
                raise ValueError(f"{self.name}: the chat template does not render each message's content once")
            segments.append(head)
        return segments + [text]

    @staticmethod
    def _check_question(question: str) -> None:
        if "\x00specscale-" in question:
            raise ValueError("the question contains the format's marker string")

    @staticmethod
    def _check_index(index: int) -> None:
        if index < 0:
            raise ValueError(f"step index must be >= 0, got {index}")


class QwenMathPRMFormat(PRMFormat):
    """system / user(question) / assistant(step_1 <extra_0> step_2 <extra_0> ...).

    Pieces: head = everything up to the assistant content; piece = content +
    [<extra_0>] (reward at the separator); closing = what the template writes after
    the assistant content (``<|im_end|>\\n``)."""

    name = "qwen_math_prm"

    def __init__(self, tokenizer, system_prompt: str = QWEN_MATH_PRM_SYSTEM, step_token: str = "<extra_0>"):
        super().__init__(tokenizer)
        self.system_prompt = system_prompt
        self.step_token = step_token
        self.step_token_id = self._single_token(step_token)
        _, closing = self._head_and_closing_text("q")
        self._closing = self._tokenize(closing)

    def _messages(self, question: str, assistant: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": assistant},
        ]

    def _head_and_closing_text(self, question: str) -> tuple[str, str]:
        mark = _MARK.format("steps")
        head, closing = self._render_split(self._messages(question, mark), [mark])
        return head, closing

    def encode(self, question: str, steps: Sequence[str]) -> PRMInput:
        if not steps:
            raise ValueError("a path needs at least one step")
        for i, step in enumerate(steps):
            if self.step_token in step:
                raise ValueError(f"step {i} contains the step separator {self.step_token!r}")
        messages = self._messages(question, self.step_token.join(steps) + self.step_token)
        ids = render_chat(self.tokenizer, messages)
        positions = [i for i, t in enumerate(ids) if t == self.step_token_id]
        if len(positions) != len(steps):
            raise ValueError(
                f"found {len(positions)} {self.step_token!r} tokens for {len(steps)} steps "
                "(does the question contain the separator?)"
            )
        return PRMInput(tuple(ids), tuple(positions))

    def head_ids(self, question: str) -> list[int]:
        self._check_question(question)
        if self.step_token in question:
            raise ValueError(f"the question contains the step separator {self.step_token!r}")
        head, _ = self._head_and_closing_text(question)
        return self._tokenize(head)

    def content_ids(self, text: str) -> list[int]:
        if self.step_token in text:
            raise ValueError(f"step text contains the step separator {self.step_token!r}")
        return self._tokenize(text)

    def step_piece(self, index: int, content_ids: Sequence[int]) -> tuple[list[int], int]:
        self._check_index(index)
        piece = [int(t) for t in content_ids]
        if self.step_token_id in piece:
            # A second separator would add a reward position the search never asked for.
            raise ValueError(f"step {index}: its content holds the step separator {self.step_token!r}")
        piece.append(self.step_token_id)
        return piece, len(piece) - 1

    def closing_ids(self) -> list[int]:
        return list(self._closing)


class RLHFlowPRMFormat(PRMFormat):
    """One user turn per step (the first is ``question + " " + step``), each answered by
    an assistant "+"; a step's reward is read at the last assistant-header token (the
    position that predicts "+").

    Pieces: head = BOS + user header + question; piece 0 = tokens(" " + step) + end of
    turn + assistant header; piece i > 0 = "+" + end of turn + user header (closing the
    previous step's assistant turn) + step + end of turn + assistant header; closing =
    "+" + end of turn. The join space goes with piece 0, not the head, because the
    pre-tokenizer attaches a space to the word after it (" Step" is one token): this
    keeps piecewise == whole, and piece 0 stays question-independent."""

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
        self._init_pieces()

    def _init_pieces(self) -> None:
        s0, a0, s1, a1 = (_MARK.format(k) for k in ("s0", "a0", "s1", "a1"))
        messages = [
            {"role": "user", "content": "q " + s0},
            {"role": "assistant", "content": a0},
            {"role": "user", "content": s1},
            {"role": "assistant", "content": a1},
        ]
        _, to_assistant, to_user, to_assistant_2, closing = self._render_split(messages, [s0, a0, s1, a1])
        if to_assistant != to_assistant_2:
            raise ValueError("rlhflow: the template renders the steps' turn boundaries differently")
        self._to_assistant = self._tokenize(to_assistant)  # end of user turn + assistant header
        self._to_user = self._tokenize(self.plus + to_user)  # "+" + end of turn + user header
        self._closing = self._tokenize(self.plus + closing)  # "+" + end of turn (+ template tail)
        # Each literal must tokenize as it does inside the whole render, and "+" must be a
        # token of its own (the reward is read at the position right before it).
        for tail, ids in ((to_user, self._to_user), (closing, self._closing)):
            if ids[:1] != [self.plus_id] or self._tokenize(to_assistant + self.plus + tail) != self._to_assistant + ids:
                raise ValueError("rlhflow: the template's turn boundaries are not token boundaries for this tokenizer")
        # Templates that trim message content (Llama 3: ``message['content'] | trim``):
        # a step's text is stripped the same way.
        mark = _MARK.format("ws")
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": " \t" + mark + " \t"}], tokenize=False, add_generation_prompt=False
        )
        self._strips_content = (" \t" + mark + " \t") not in text

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

    def head_ids(self, question: str) -> list[int]:
        self._check_question(question)
        mark = _MARK.format("s0")
        # Rendered with the question itself, so the template's own treatment of it
        # (trimmed leading whitespace) is kept; the join space is piece 0's.
        head, _ = self._render_split(
            [{"role": "user", "content": f"{question} {mark}"}, {"role": "assistant", "content": self.plus}], [mark]
        )
        if not head.endswith(" "):
            raise ValueError("rlhflow: the template does not keep the space between question and step")
        return self._tokenize(head[:-1])

    def content_ids(self, text: str) -> list[int]:
        return self._tokenize(text.strip() if self._strips_content else text)

    def step_piece(self, index: int, content_ids: Sequence[int]) -> tuple[list[int], int]:
        self._check_index(index)
        if index == 0:
            piece = self._first_content(content_ids)
        else:
            piece = self._to_user + [int(t) for t in content_ids]
        piece.extend(self._to_assistant)
        return piece, len(piece) - 1

    def _first_content(self, content_ids: Sequence[int]) -> list[int]:
        """Step 1 follows ``question + " "`` in the same turn: re-tokenize " " + its text,
        so the space merges with the first word as in the whole render (O(step) host work,
        once per first-round candidate). Byte-level BPE decodes ids to their exact text."""
        if not content_ids:
            # question + " " + "" is trimmed to the question by a trimming template.
            return [] if self._strips_content else self._tokenize(" ")
        text = self.tokenizer.decode(list(content_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return self._tokenize(" " + text)

    def closing_ids(self) -> list[int]:
        return list(self._closing)
