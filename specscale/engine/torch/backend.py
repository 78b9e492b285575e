"""The torch backend: the Backend protocol over a real generator and a real PRM.

The scheduler (``GenerationEngine``) owns block ids, refcounts, forks, CD grouping and
sampling; this class turns its ``GenBatch`` into one paged forward of the generator
and returns logits, and turns ``ScoreItem``s into one batched PRM pass. Every call
reports the wall-clock seconds it took (device-synchronised), which become the
Server's clock.

Two rules keep runs well-defined at the edges:

* Context window. A path never grows past the generator's window: the engine ends it,
  terminal, when its history fills ``max_model_len`` (``GenerationEngine.max_len``, read
  from this backend). The rule depends on the history length only, so every policy
  sees it identically.
* Identical PRM inputs get identical rewards within a run. Float results of one input
  can differ in the last bits with the batch around it; the search breaks score ties by
  position, so two identical texts must tie exactly. The first rewards computed for an
  input are reused for later copies of it (the copies are still computed, so measured
  time does not change).
"""

from __future__ import annotations

import hashlib
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from specscale.engine.backend import GenBatch, ScoreItem
from specscale.engine.torch.model_runner import ModelRunner, RunnerKVMemory
from specscale.engine.torch.prm import ProcessRewardModel
from specscale.engine.torch.prm_format import PRMInput, QwenMathPRMFormat
from specscale.engine.torch.text import delimiter_token_ids, eos_token_ids, special_strings, step_text
from specscale.search.candidate import END_DELIMITER


@dataclass
class _Encoding:
    """PRM input of one candidate's whole path (dropped once scored; the length stays)."""

    n_tokens: int
    inp: PRMInput | None
    encode_s: float  # host time spent building it, charged to the PRM batch that uses it


class TorchBackend(RunnerKVMemory):
    def __init__(
        self,
        runner: ModelRunner,
        prm: ProcessRewardModel,
        tokenizer,
        problems: Mapping[int, Any],
    ) -> None:
        self.runner = runner
        self.prm = prm
        self.tokenizer = tokenizer
        self.problems = dict(problems)  # request_id -> Problem (the Server numbers requests by position)
        cfg = runner.config
        self.vocab_size = cfg.vocab_size
        self.max_model_len = runner.max_model_len
        self.eos_ids = eos_token_ids(tokenizer, runner.model_dir, cfg.eos_token_id, self.vocab_size)
        self.delimiter_ids = delimiter_token_ids(tokenizer, self.vocab_size) - self.eos_ids
        # Strings the PRM tokenizer would read as its own markup (its step separator first).
        forbidden = set(special_strings(prm.tokenizer))
        if isinstance(prm.format, QwenMathPRMFormat):
            forbidden.add(prm.format.step_token)
        self._forbidden = sorted(forbidden, key=len, reverse=True)
        self._prompts: dict[Any, list[int]] = {}
        self._steps: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._encodings: "weakref.WeakKeyDictionary[Any, _Encoding]" = weakref.WeakKeyDictionary()
        self._rewards_seen: dict[bytes, list[float]] = {}

    # ------------------------------------------------------------------ prompts
    def prompt_tokens(self, problem: Any) -> list[int]:
        key = getattr(problem, "id", None) or id(problem)
        ids = self._prompts.get(key)
        if ids is None:
            from specscale.data.prompts import build_generator_prompt

            text = build_generator_prompt(self.tokenizer, problem.problem)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) >= self.max_model_len:
                raise ValueError(
                    f"problem {getattr(problem, 'id', '?')}: the generator prompt has {len(ids)} tokens, "
                    f"which leaves no room in the generator's context window "
                    f"(max_position_embeddings={self.max_model_len}, {self.runner.model_dir})"
                )
            self._prompts[key] = ids
        return list(ids)

    # ------------------------------------------------------------------ generation
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, float]:
        runner = self.runner

        def work() -> torch.Tensor:
            attn, hidden, want = runner.run_gen_batch(batch)
            if want:
                return runner.compute_logits(hidden, attn, want)
            return torch.empty(0, self.vocab_size, dtype=torch.promote_types(runner.dtype, torch.float32))

        return runner.timed(work)

    # ------------------------------------------------------------------ verification
    def _step_text(self, c: Any) -> str:
        text = self._steps.get(c)
        if text is None:
            text = step_text(self.tokenizer, c.step_tokens, c.end_reason == END_DELIMITER, self._forbidden)
            self._steps[c] = text
        return text

    def _encode(self, c: Any) -> _Encoding:
        t0 = time.perf_counter()
        steps = [self._step_text(p) for p in c.path()]
        inp = self.prm.format.encode(self.problems[c.request_id].problem, steps)
        return _Encoding(len(inp.token_ids), inp, time.perf_counter() - t0)

    def prm_path_tokens(self, c: Any) -> int:
        if c.round < 0:
            return 0
        enc = self._encodings.get(c)
        if enc is None:
            enc = self._encodings[c] = self._encode(c)
        return enc.n_tokens

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        (out, charged), seconds = self.runner.timed(lambda: self._score(items))
        return out, seconds + charged

    def _score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        charged = 0.0
        inputs: list[PRMInput] = []
        for it in items:
            c = it.candidate
            enc = self._encodings.get(c)
            if enc is None or enc.inp is None:
                enc = self._encodings[c] = self._encode(c)  # timed inside this call
            else:
                charged += enc.encode_s  # built earlier for accounting: its cost belongs here
            inputs.append(enc.inp)
        rewards = self.prm.score_token_ids(inputs)
        out = []
        for it, inp, r in zip(items, inputs, rewards):
            digest = hashlib.blake2b(np.asarray(inp.token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()
            out.append(list(self._rewards_seen.setdefault(digest, r)))
            enc = self._encodings[it.candidate]
            enc.inp = None  # scored: keep only the length
        return out, charged

    # ------------------------------------------------------------------ answers and memory
    def path_text(self, c: Any) -> str:
        tokens: list[int] = []
        for p in c.path():
            tokens.extend(p.step_tokens)
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def answer(self, c: Any) -> str | None:
        from specscale.grading import extract_boxed

        return extract_boxed(self.path_text(c))

    def equivalent(self, a: Any, b: Any) -> bool:
        from specscale.grading import answers_equivalent

        return a is not None and b is not None and answers_equivalent(str(a), str(b))

