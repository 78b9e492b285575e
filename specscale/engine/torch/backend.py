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

import weakref
from typing import Any, Mapping, Sequence

import torch

from specscale.engine.backend import GenBatch, ScoreItem, Seconds, resolve_seconds, score_waves
from specscale.engine.torch.kv_cache import PagedKVCache
from specscale.engine.torch.model_runner import ModelRunner, RunnerKVMemory
from specscale.server.clock import WallClock
from specscale.engine.torch.prm import PendingRewards, ProcessRewardModel, read_rewards
from specscale.engine.torch.prm_format import QwenMathPRMFormat
from specscale.engine.torch.prm_paths import PRMPaths
from specscale.data.prompts import STEP_DELIMITER
from specscale.engine.torch.text import delimiter_token_ids, eos_token_ids, special_strings, step_text
from specscale.search.candidate import END_DELIMITER


class TorchServing(RunnerKVMemory):
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


class TorchBackend(TorchServing):
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
        prm_tok = prm.tokenizer
        self._same_vocab = prm_tok is not None and tokenizer.get_vocab() == prm_tok.get_vocab()
        self._prm_special = frozenset(prm_tok.all_special_ids) | frozenset(
            i for i, t in getattr(prm_tok, "added_tokens_decoder", {}).items() if getattr(t, "special", False)
        ) if prm_tok is not None else frozenset()
        closing = prm.format.closing_ids()
        self.prm_closing_tokens = len(closing)
        self._paths = PRMPaths(self._prm_head, self._prm_piece, closing, vocab_size=prm.config.vocab_size)

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
    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, Seconds]:
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

    def _prm_head(self, request_id: int) -> list[int]:
        return self.prm.format.head_ids(self.problems[request_id].problem)

    def _prm_content(self, c: Any) -> list[int]:
        """A step's content as PRM token ids. When the PRM reads the generator's vocabulary
        (Qwen2.5-Math-PRM with Qwen2.5, the RLHFlow PRM with Llama 3) the generated ids are
        used as they are, less special tokens (EOS, end of turn, the PRM's own markup) and
        the trailing step delimiter; otherwise the step's text is tokenized for the PRM."""
        fmt = self.prm.format
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
        return self.prm.format.step_piece(c.round, self._prm_content(c))

    def prm_path_tokens(self, c: Any) -> int:
        return self._paths.prefix_len(c)

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


def launch_score_wave(prm: Any, wave: Sequence[ScoreItem], rows: Sequence[Any]) -> PendingRewards:
    """One wave of a PRM batch, queued on the device: its copy-on-write copies, then its
    rows. The stream runs the waves in order, so a later wave reads the KV an earlier one
    wrote without the host waiting in between."""
    copies = [cp for it in wave for cp in it.block_copies]
    if copies:
        prm.copy_blocks(copies)
    return prm.launch_rows(rows)
