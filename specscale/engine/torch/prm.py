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
from specscale.engine.torch.config import ModelConfig, load_model_config
from specscale.engine.torch.loader import load_model, random_model
from specscale.engine.torch.prm_format import PRMInput, QwenMathPRMFormat, RLHFlowPRMFormat
from specscale.engine.torch.tokenizer import load_tokenizer

PRM_FORMATS = ("qwen_math_prm", "rlhflow")


class IdsOnlyFormat:
    """Stand-in format of a PRM without a tokenizer: callers build ``PRMInput``s from
    token ids themselves (``score_token_ids``); ``encode`` is not available."""

    plus_id, minus_id = 0, 1

    def encode(self, question, steps):
        raise ValueError("this PRM has no tokenizer (random weights, token ids only): use score_token_ids")


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
        config: ModelConfig | None = None,
        load_format: str = "auto",
        seed: int = 0,
    ):
        """prm_format: "qwen_math_prm" | "rlhflow" | None (from the architecture:
        Qwen2ForProcessRewardModel -> qwen_math_prm, a causal LM -> rlhflow).
        max_model_len: longest input accepted (None = the config's
        max_position_embeddings). A larger value lets RoPE run past the trained
        window, as transformers' own model would; use it knowingly."""
        if load_format not in ("auto", "checkpoint", "random"):
            raise ValueError(f"unknown load_format {load_format!r}")
        self.model_dir = Path(model_dir) if model_dir is not None else None
        if config is None:
            if self.model_dir is None:
                raise ValueError("ProcessRewardModel needs a checkpoint directory or a ModelConfig")
            config = load_model_config(self.model_dir)
        self.config = config
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
        if load_format == "random":
            self.model = random_model(self.config, dtype=dtype, device=self.device, seed=seed)
        else:
            self.model = load_model(self.model_dir, dtype=dtype, device=self.device, config=self.config)
        if tokenizer is None and self.model_dir is None:
            # Token ids only (random weights, synthetic tokens): no text format; the
            # RLHFlow head reads two fixed ids in place of "+" / "-".
            self.tokenizer = None
            self.format = IdsOnlyFormat()
        else:
            self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_dir)
            self.format = (
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
        if self.config.kind == "qwen_math_prm":
            return self.model.step_rewards(hidden)
        ids = torch.tensor([self.format.plus_id, self.format.minus_id], device=hidden.device)
        logits = self.model.compute_logits(hidden, token_ids=ids)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)[:, 0]
