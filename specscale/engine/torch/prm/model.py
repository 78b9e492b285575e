"""Process reward model: batched, prefill-only step scoring.

Paths are packed into flat batches and run through the same decoder and
attention backend as the generator; only the hidden states at reward positions
go through the head. Two kinds of rows (``PRMRow``):

* no-cache rows: a whole path, attending only to itself (``score_token_ids``);
* cached rows (PRM prefix cache): only the tokens past a prefix already in the
  PRM's paged KV cache, run as a cached prefill over the row's block table
  exactly like a generator prefill chunk (K/V of the new tokens are written to
  their slots). Block tables, refcounts, copy-on-write and eviction are the
  caller's (``BlockManager``); this class stores and copies blocks on request.

Heads:

* Qwen2.5-Math-PRM:  softmax(score(h))[1]                  (``Qwen2ForProcessRewardModel``)
* RLHFlow Llama PRM: softmax(lm_head(h)[["+", "-"]])[0]    (plain ``LlamaForCausalLM``)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from specscale.engine.torch.attention.backends import AttentionBackend, TorchAttentionBackend
from specscale.engine.torch.attention.batch import HostStaging, debug_checks_default
from specscale.engine.to_device import to_device
from specscale.engine.torch.model_config import ModelConfig, load_model_config
from specscale.engine.torch.model.fused_ops import FusedOps, warm_forwards
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.model.loader import load_model, random_model
from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.torch.prm.batch import PRMChunk, RowArrays, build_chunks, check_rows
from specscale.engine.text.prm_format import PRMInput, QwenMathPRMFormat, RLHFlowPRMFormat
from specscale.engine.text.tokenizer import load_tokenizer

PRM_FORMATS = ("qwen_math_prm", "rlhflow")


@dataclass(frozen=True)
class PendingRewards:
    """The rewards of one ``launch_rows`` call, still on the device: ``values`` holds them
    flat in ``order`` (row indices, chunk by chunk), ``counts[k]`` of them for row
    ``order[k]``; ``num_rows`` rows in all."""

    values: torch.Tensor | None
    order: list[int]
    counts: list[int]
    num_rows: int

    def split(self, flat: Sequence[float]) -> list[list[float]]:
        """Host rewards (``values`` as a list) -> per row, in row order."""
        results: list[list[float]] = [[] for _ in range(self.num_rows)]
        at = 0
        for i, k in zip(self.order, self.counts):
            results[i] = list(flat[at: at + k])
            at += k
        return results


def read_rewards(pending: Sequence[PendingRewards]) -> list[list[list[float]]]:
    """Every call's rewards with one device->host copy: the only wait for the device of a
    PRM batch (a copy per call, or per chunk, would wait once per forward)."""
    sizes = [p.values.numel() if p.values is not None else 0 for p in pending]
    parts = [p.values for p, n in zip(pending, sizes) if n]
    flat = torch.cat(parts).tolist() if parts else []
    out, at = [], 0
    for p, n in zip(pending, sizes):
        out.append(p.split(flat[at: at + n]))
        at += n
    return out


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
        debug_checks: bool | None = None,
        fused_ops: bool | FusedOps = False,
    ):
        """prm_format: "qwen_math_prm" | "rlhflow" | None (from the architecture:
        Qwen2ForProcessRewardModel -> qwen_math_prm, a causal LM -> rlhflow).
        max_model_len: longest input accepted (None = the config's
        max_position_embeddings). A larger value lets RoPE run past the trained
        window, as transformers' own model would; use it knowingly.
        debug_checks: per-token and per-block checks of every batch (None:
        $SPECSCALE_DEBUG_CHECKS, which the tests set; token ids of scored paths are checked
        once, where ``PRMPaths`` builds them).
        fused_ops: engine.fused_ops, as for the generator (``ModelRunner``; the two share one
        ``FusedOps`` in a run): installed and compiled by ``warm_up``, eager until then."""
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
        # The rotary table covers the window (an override may reach past the config's),
        # built now rather than in a served forward.
        self.model.model.rotary.reserve(self.max_model_len)
        self.model.model.rotary.table(self.device, self.dtype)
        self.fused_ops = fused_ops if isinstance(fused_ops, FusedOps) else FusedOps(bool(fused_ops))
        # PRM prefix cache: no pool until allocate_kv_cache (sized after the weights load).
        self.kv_cache: PagedKVCache | None = None
        self.block_size: int | None = None
        self.debug_checks = debug_checks_default() if debug_checks is None else debug_checks
        # One staging for every PRM forward's inputs: a second upload before the first has
        # been copied takes fresh buffers (HostStaging), so the kinds need no buffers of their own.
        self._staging = HostStaging(self.device)
        self._ramp = np.arange(self.max_model_len, dtype=np.int32)  # positions of PRM rows: slices of it

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

    def warm_up(self) -> float:
        """Before serving: give the model the op set ``fused_ops`` asks for (compiled ops are
        compiled now, by forwards at every shape class). Seconds spent."""
        t0 = time.perf_counter()
        self.fused_ops.apply(self.model.model, lambda: warm_forwards(self.model, self.backend, self.device,
                                                                    self.config))
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ KV cache
    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.embed_tokens.weight.dtype

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache.num_blocks if self.kv_cache is not None else 0

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Replace the PRM's KV pool by one of ``num_blocks`` blocks of ``block_size``
        tokens (in the model's dtype). Its contents are not kept."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.kv_cache = None  # release the old pool before allocating the new one
        self.kv_cache = PagedKVCache.for_model(self.config, num_blocks, block_size, self.dtype, self.device)
        self.block_size = block_size

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: copy each block ``src`` -> ``dst`` (all layers, K and V), before
        the forward that writes into ``dst``."""
        if not pairs:
            return
        if self.kv_cache is None:
            raise ValueError("copy_blocks: the PRM has no KV cache (allocate_kv_cache)")
        src, dst = zip(*pairs)
        self.kv_cache.copy_block(list(src), list(dst))

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def score_rows(self, rows: Sequence[PRMRow]) -> list[list[float]]:
        """Rewards at each row's reward positions, in row order.

        Cached rows (with a block table) and no-cache rows run as separate forwards, each
        kind packed in input order under ``max_batch_tokens`` new tokens (a row longer
        than that runs alone). Cached rows run first; a cached row should read only K/V
        written by earlier calls (the attention backends write a layer's new K/V before
        reading it, so a later row of the same call reading an earlier row's fresh blocks
        works too, but a copy-on-write ``copy_blocks`` before the call would copy them
        unwritten)."""
        return read_rewards([self.launch_rows(rows)])[0]

    @torch.inference_mode()
    def launch_rows(self, rows: Sequence[PRMRow]) -> "PendingRewards":
        """``score_rows`` without waiting: its forwards are queued on the device and the
        rewards stay there until ``read_rewards``, which reads any number of calls with
        one device->host copy (a PRM batch of several waves waits for the device once)."""
        chunks = self.prepare_rows(rows)
        per_chunk = [self._run_chunk(chunk) for chunk in chunks]
        order = [i for chunk in chunks for i in chunk.members]
        return PendingRewards(torch.cat(per_chunk) if per_chunk else None, order,
                              [len(rows[i].reward_positions) for i in order], len(rows))

    def prepare_rows(self, rows: Sequence[PRMRow]) -> list[PRMChunk]:
        """The host side of ``score_rows``: checks, packing, and each forward's inputs, laid
        out flat for all rows of a kind at once (``prm_batch``).

        Token ids are checked against the vocabulary where they are made, once per new
        token (``PRMPaths``), so here only with ``debug_checks``; the O(rows) checks
        (lengths, context window, reward positions, table size) always run."""
        facts = RowArrays.of(rows)
        check_rows(rows, facts, max_model_len=self.max_model_len,
                   window_note="" if self._max_model_len is None else " (max_model_len override)",
                   vocab_size=self.config.vocab_size, kv_blocks=None if self.kv_cache is None else self.kv_cache.num_blocks,
                   block_size=self.block_size, full=self.debug_checks)
        chunks = []
        for cached in (True, False):
            members = np.flatnonzero(facts.cached == cached)
            if members.size:
                bs = self.block_size if cached else 16
                chunks += build_chunks(rows, members, facts, max_tokens=self.max_batch_tokens, block_size=bs,
                                       staging=self._staging, cached=cached, ramp=self._ramp,
                                       debug=self.debug_checks)
        return chunks

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
            ids = np.asarray(inp.token_ids)
            bad = (ids < 0) | (ids >= self.config.vocab_size)
            if bad.any():
                raise ValueError(
                    f"path {i}: token id {int(ids[np.argmax(bad)])} outside the vocabulary [0, {self.config.vocab_size})"
                )
        # Whole paths = no-cache rows (the checks above keep their "path i" wording).
        return self.score_rows([PRMRow(inp.token_ids, 0, None, inp.reward_positions) for inp in inputs])

    def _run_chunk(self, chunk: "PRMChunk") -> torch.Tensor:
        """One forward -> the rewards at the chunk's reward positions, flattened in row order."""
        batch = chunk.batch
        plan = self.backend.plan(batch)
        hidden = self.model(batch.input_ids, batch.positions, self.backend, plan,
                            self.kv_cache if chunk.cached else None)
        if chunk.reward_index is None:  # rows that only write K/V (e.g. a prefix or closing tokens)
            return hidden.new_empty(0)
        return self.step_rewards(hidden.index_select(0, chunk.reward_index))

    def step_rewards(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states at reward positions [N, h] -> rewards in [0, 1], [N]."""
        if self.config.kind == "qwen_math_prm":
            return self.model.step_rewards(hidden)
        # to_device: a pinned, non-blocking copy (torch.tensor(..., device=cuda) would copy from
        # pageable memory and wait for the stream inside the PRM forward).
        ids = to_device([self.format.plus_id, self.format.minus_id], torch.long, hidden.device)
        logits = self.model.compute_logits(hidden, token_ids=ids)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)[:, 0]
