"""Process reward model: batched, prefill-only step scoring.

Paths are packed into flat no-cache batches (each row attends only to itself)
and run through the same decoder and attention backend as the generator; only
the hidden states at reward positions go through the head:

* Qwen2.5-Math-PRM:  softmax(score(h))[1]                  (``Qwen2ForProcessRewardModel``)
* RLHFlow Llama PRM: softmax(lm_head(h)[["+", "-"]])[0]    (plain ``LlamaForCausalLM``)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from specscale.engine.torch.attention import AttentionBackend, TorchAttentionBackend
from specscale.engine.torch.attention_batch import AttentionBatch, BatchRow
from specscale.engine.torch.config import load_model_config
from specscale.engine.torch.loader import load_model
from specscale.engine.torch.prm_format import PRMFormat, PRMInput, QwenMathPRMFormat, RLHFlowPRMFormat
from specscale.engine.torch.tokenizer import load_tokenizer

PRM_FORMATS = ("qwen_math_prm", "rlhflow")


class ProcessRewardModel:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str = "cpu",
        prm_format: str | None = None,
        max_batch_tokens: int = 8192,
        attention_backend: AttentionBackend | None = None,
        tokenizer=None,
        max_model_len: int | None = None,
    ):
        """prm_format: "qwen_math_prm" | "rlhflow" | None (from the architecture:
        Qwen2ForProcessRewardModel -> qwen_math_prm, a causal LM -> rlhflow).
        max_model_len: longest input accepted (None = the config's
        max_position_embeddings). A larger value lets RoPE run past the trained
        window, as transformers' own model would; use it knowingly."""
        self.model_dir = Path(model_dir)
        self.config = load_model_config(self.model_dir)
        auto = "qwen_math_prm" if self.config.kind == "qwen_math_prm" else "rlhflow"
        prm_format = prm_format or auto
        if prm_format not in PRM_FORMATS:
            raise ValueError(f"unknown PRM format {prm_format!r}; expected one of {PRM_FORMATS}")
        if prm_format != auto:
            raise ValueError(
                f"PRM format {prm_format!r} does not fit architecture {self.config.architecture} "
                f"(which implies {auto!r})"
            )
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.device = torch.device(device)
        self.model = load_model(self.model_dir, dtype=dtype, device=self.device, config=self.config)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_dir)
        self.format: PRMFormat = (
            QwenMathPRMFormat(self.tokenizer) if prm_format == "qwen_math_prm" else RLHFlowPRMFormat(self.tokenizer)
        )
        self.backend = attention_backend or TorchAttentionBackend()
        self.max_batch_tokens = max_batch_tokens
        if max_model_len is not None and max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        self._max_model_len = max_model_len

    @property
    def max_model_len(self) -> int:
        return self._max_model_len or self.config.max_position_embeddings

    def encode_paths(self, question: str, steps_per_path: Sequence[Sequence[str]]) -> list[PRMInput | None]:
        """One PRMInput per path (None for a path without steps)."""
        return [self.format.encode(question, steps) if steps else None for steps in steps_per_path]

    def score_paths(self, question: str, steps_per_path: Sequence[Sequence[str]]) -> list[list[float]]:
        """Reward of every step of every path (all paths share ``question``)."""
        encoded = self.encode_paths(question, steps_per_path)
        scores = iter(self.score_token_ids([e for e in encoded if e is not None]))
        return [next(scores) if e is not None else [] for e in encoded]

    @torch.inference_mode()
    def score_token_ids(self, inputs: Sequence[PRMInput]) -> list[list[float]]:
        """Lower-level entry: pre-tokenized paths -> rewards at their reward positions."""
        for i, inp in enumerate(inputs):
            if not inp.token_ids:
                raise ValueError(f"path {i} has no tokens")
            if len(inp.token_ids) > self.max_model_len:
                raise ValueError(
                    f"path {i} has {len(inp.token_ids)} tokens, more than the PRM's context window "
                    f"max_position_embeddings={self.max_model_len}"
                    + ("" if self._max_model_len is None else " (max_model_len override)")
                )
            bad = [t for t in inp.token_ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"path {i}: token id {bad[0]} outside the vocabulary [0, {self.config.vocab_size})")
        results: list[list[float]] = [[] for _ in inputs]
        for chunk in self._pack(inputs):
            rewards = self._score_chunk([inputs[i] for i in chunk]).tolist()
            for i in chunk:
                k = len(inputs[i].reward_positions)
                results[i], rewards = rewards[:k], rewards[k:]
        return results

    def _pack(self, inputs: Sequence[PRMInput]) -> list[list[int]]:
        """Greedy packing in input order under ``max_batch_tokens`` (an over-long path runs alone)."""
        chunks: list[list[int]] = []
        tokens = 0
        for i, inp in enumerate(inputs):
            n = len(inp.token_ids)
            if chunks and tokens + n <= self.max_batch_tokens:
                chunks[-1].append(i)
                tokens += n
            else:
                chunks.append([i])
                tokens = n
        return chunks

    def _score_chunk(self, inputs: Sequence[PRMInput]) -> torch.Tensor:
        batch = AttentionBatch.from_rows([BatchRow(inp.token_ids) for inp in inputs], device=self.device)
        hidden = self.model(batch.input_ids, batch.positions, self.backend, self.backend.plan(batch))
        gather, offset = [], 0
        for inp in inputs:
            gather.extend(offset + p for p in inp.reward_positions)
            offset += len(inp.token_ids)
        h = hidden.index_select(0, torch.tensor(gather, dtype=torch.long, device=self.device))
        return self.step_rewards(h)

    def step_rewards(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states at reward positions [N, h] -> rewards in [0, 1], [N]."""
        if isinstance(self.format, QwenMathPRMFormat):
            return self.model.step_rewards(hidden)
        ids = torch.tensor([self.format.plus_id, self.format.minus_id], device=hidden.device)
        logits = self.model.compute_logits(hidden, token_ids=ids)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)[:, 0]
