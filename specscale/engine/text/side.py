"""The text side of an engine with real tokenizers: prompts, the PRM's view of each step,
answers. The torch and vLLM backends both inherit it, so the two engines read the same
prompts, give the PRM the same token ids and grade the same answers.

A backend calls ``TextSide.__init__`` with its tokenizers and the PRM format; the methods
only read those and the problems, never the engine's tensors.
"""
from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.data.prompts import STEP_DELIMITER, build_generator_prompt
from specscale.engine.text.prm_format import QwenMathPRMFormat
from specscale.engine.text.prm_paths import PRMPaths
from specscale.engine.text.vocabulary import delimiter_token_ids, eos_token_ids, special_strings, step_text
from specscale.search.candidate import END_DELIMITER


class TextSide:
    """Prompts, PRM pieces and answers from the generator's tokenizer and the PRM format."""

    def __init__(self, tokenizer, prm_tokenizer, prm_format, problems: Mapping[int, Any], *, model_dir: Path | str,
                 max_model_len: int, vocab_size: int, eos_token_id: Any,
                 prm_vocab_size: Optional[int] = None) -> None:
        self.tokenizer = tokenizer
        self.prm_format = prm_format
        self.problems = dict(problems)  # request_id -> Problem (the Server numbers requests by position)
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_ids = eos_token_ids(tokenizer, model_dir, eos_token_id, vocab_size)
        self.delimiter_ids = delimiter_token_ids(tokenizer, vocab_size) - self.eos_ids
        # Strings the PRM tokenizer would read as its own markup (its step separator first).
        forbidden = set(special_strings(prm_tokenizer))
        if isinstance(prm_format, QwenMathPRMFormat):
            forbidden.add(prm_format.step_token)
        self._forbidden = sorted(forbidden, key=len, reverse=True)
        self._prompts: dict[Any, list[int]] = {}
        self._steps: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._same_vocab = prm_tokenizer is not None and tokenizer.get_vocab() == prm_tokenizer.get_vocab()
        self._prm_special = frozenset(prm_tokenizer.all_special_ids) | frozenset(
            i for i, t in getattr(prm_tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)
        ) if prm_tokenizer is not None else frozenset()
        closing = prm_format.closing_ids()
        self.prm_closing_tokens = len(closing)
        self._paths = PRMPaths(self._prm_head, self._prm_piece, closing, vocab_size=prm_vocab_size)

    # ------------------------------------------------------------------ prompts
    def prompt_tokens(self, problem: Any) -> list[int]:
        key = getattr(problem, "id", None) or id(problem)
        ids = self._prompts.get(key)
        if ids is None:
            text = build_generator_prompt(self.tokenizer, problem.problem)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) >= self.max_model_len:
                raise ValueError(
                    f"problem {getattr(problem, 'id', '?')}: the generator prompt has {len(ids)} tokens, "
                    f"which leaves no room in the generator's context window "
                    f"(max_position_embeddings={self.max_model_len}, {self.model_dir})"
                )
            self._prompts[key] = ids
        return list(ids)

    # ------------------------------------------------------------------ the PRM's pieces
    def _step_text(self, c: Any) -> str:
        text = self._steps.get(c)
        if text is None:
            text = step_text(self.tokenizer, c.step_tokens, c.end_reason == END_DELIMITER, self._forbidden)
            self._steps[c] = text
        return text

    def _prm_head(self, request_id: int) -> list[int]:
        return self.prm_format.head_ids(self.problems[request_id].problem)

    def _prm_content(self, c: Any) -> list[int]:
        """A step's content as PRM token ids. When the PRM reads the generator's vocabulary
        (Qwen2.5-Math-PRM with Qwen2.5, the RLHFlow PRM with Llama 3) the generated ids are
        used as they are, less special tokens (EOS, end of turn, the PRM's own markup) and
        the trailing step delimiter; otherwise the step's text is tokenized for the PRM."""
        fmt = self.prm_format
        if not self._same_vocab:
            return fmt.content_ids(self._step_text(c))
        ids = [t for t in c.step_tokens if t not in self._prm_special]
        if c.end_reason == END_DELIMITER and ids:
            text = self.tokenizer.decode([ids[-1]])
            cut = text.rfind(STEP_DELIMITER)
            if cut >= 0:
                keep = text[:cut].rstrip("\r\n")
                ids = ids[:-1] + (list(fmt.content_ids(keep)) if keep else [])
        return ids

    def _prm_piece(self, c: Any) -> tuple[list[int], int]:
        return self.prm_format.step_piece(c.round, self._prm_content(c))

    def prm_path_tokens(self, c: Any) -> int:
        return self._paths.prefix_len(c)

    # ------------------------------------------------------------------ answers
    def path_text(self, c: Any) -> str:
        tokens: list[int] = []
        for p in c.path():
            tokens.extend(p.step_tokens)
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def answer(self, c: Any) -> str | None:
        from specscale.grading import extract_boxed  # math-verify's import is heavy: on first use

        return extract_boxed(self.path_text(c))

    def equivalent(self, a: Any, b: Any) -> bool:
        from specscale.grading import answers_equivalent

        return a is not None and b is not None and answers_equivalent(str(a), str(b))
