"""The Backend protocol on vLLM, and the factory hook that hands the Server a
``VLLMGeneration`` as its generation side (``make_generation_side``).

Text handling is ``TextSide`` (specscale/engine/text/side.py), the one the torch backend
inherits too: the same prompts, the same PRM input pieces as token ids, the same answer
extraction and grading.

Time: the Server runs on the wall clock of the serving loop (``WallClock``);
``LLMEngine.step`` returns once its outputs are on the host, so generation and PRM
seconds are measured around vLLM's calls and the rest is "other" (docs/design.md §5).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from specscale.engine.backend import BackendBase, ScoreItem
from specscale.engine.text.prm_format import QwenMathPRMFormat
from specscale.engine.text.side import TextSide
from specscale.engine.vllm.generation import VLLMGeneration
from specscale.engine.vllm.prm import VLLMNextTokenPRM, VLLMPRM
from specscale.clock import WallClock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Generator:
    """What run_cell reads from ``backend.runner``."""

    model_dir: Path
    warmup_seconds: float  # vLLM's start-up (before the clock)
    memory_plan: None = None
    device: None = None  # vLLM's own (provenance resolves engine.device)


def kv_bytes_per_block(config: Mapping[str, Any], block_size: int, dtype_bytes: int) -> int:
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes * block_size


class VLLMBackend(BackendBase, TextSide):
    def __init__(self, engines, tokenizer, prm_format, problems: Mapping[int, Any], settings,
                 gen_config: Mapping[str, Any], prm_config: Mapping[str, Any], dtype_bytes: int) -> None:
        self.engines = engines
        self.settings = settings
        self.runner = _Generator(Path(settings.gen_model), engines.startup_s)
        TextSide.__init__(self, tokenizer, prm_format.tokenizer, prm_format, problems, model_dir=settings.gen_model,
                          max_model_len=settings.max_model_len, vocab_size=int(gen_config["vocab_size"]),
                          eos_token_id=gen_config.get("eos_token_id"))
        if isinstance(prm_format, QwenMathPRMFormat):
            self.prm_engine = VLLMPRM(engines.prm, engines.step_tag_id)
        else:  # RLHFlow "+"/"-": next-token logprobs of the two ids, one request per step prefix
            self.prm_engine = VLLMNextTokenPRM(engines.prm, prm_format.plus_id, prm_format.minus_id)
        self._gen_bytes = kv_bytes_per_block(gen_config, 1, dtype_bytes)
        self._prm_bytes = kv_bytes_per_block(prm_config, 1, dtype_bytes)
        self.gen: VLLMGeneration | None = None
        self._cd_requested = False

    # ------------------------------------------------------------------ the Server's hook
    def make_generation_side(self, sampling, limits, step_token_cap: int, path_token_cap: int, dedup: bool, *,
                             kv_blocks: int | None, prefix_caching: bool) -> VLLMGeneration:
        """vLLM's own scheduler and KV pool: kv_blocks and prefix_caching are vLLM's settings
        (engine.vllm.*), not the harness's."""
        if limits.block_size != self.settings.block_size:
            raise ValueError(f"engine.block_size {limits.block_size} differs from vLLM's {self.settings.block_size}")
        self._cd_requested = bool(dedup)
        if dedup:
            logger.info("engine=vllm: the policy's token-level CD has no vLLM equivalent; each member is its own "
                        "request (engine_features.token_level_cd=false)")
        self.gen = VLLMGeneration(
            self.engines.gen, self.engines.probe, sampling, limits, step_token_cap, path_token_cap,
            self.max_model_len, self.eos_ids, self.delimiter_ids,
        )
        return self.gen

    @property
    def engine_features(self) -> dict[str, Any]:
        """What this engine can and cannot express (recorded in every summary)."""
        return {
            "engine": "vllm",
            "token_level_cd": False,  # identical concurrent draws are separate requests (no merging)
            "token_level_cd_requested": self._cd_requested,  # the policy asked for CD; it did not run
            "prefix_sharing": "vllm_automatic_prefix_caching",
            "prm_prefix_cache": False,  # the harness's own PRM cache is off; the PRM's KV is vLLM's
            # How the PRM is scored on vLLM: step_tag_pooling (Qwen2.5-Math-PRM, pooling runner,
            # whole paths) | next_token_logprob_token_ids (RLHFlow "+"/"-", one greedy 1-token
            # request per step prefix, raw logprobs of the two ids).
            "prm_head": self.prm_engine.scoring,
            "prm_prefix_sharing": (
                "vllm_automatic_prefix_caching" if self.prm_engine.prefix_sharing else "none_whole_paths"
            ),
            "per_request_seed": True,
            "batch_invariant": self.settings.batch_invariant,
            "chunked_prefill": False,
        }

    def summary_extras(self) -> dict[str, Any]:
        """vLLM's own accounting of the cell (added to its summary)."""
        gen, prm = self.gen, self.prm_engine.counts
        return {
            "warmup_s": self.engines.startup_s,
            "vllm_step_requests": gen.submitted_requests if gen is not None else 0,
            "vllm_aborted_requests": gen.aborted_requests if gen is not None else 0,
            "vllm_prompt_tokens_computed": gen.prompt_tokens_computed if gen is not None else 0,
            "vllm_prompt_tokens_cached": gen.prefix_hit_tokens if gen is not None else 0,
            "vllm_prm_tokens_computed": prm.tokens_computed,
            "vllm_prm_tokens_cached": prm.tokens_cached,
            "vllm_prm_requests": prm.requests,
            "vllm_kv_used_blocks_end": gen.blocks.num_used if gen is not None else 0,
        }

    # ------------------------------------------------------------------ verification
    def forward(self, batch):
        raise RuntimeError("engine=vllm generates through VLLMGeneration, not GenBatch forwards")

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        """Whole-path PRM inputs (the same token ids the torch PRM reads with the cache off)."""
        rewards, seconds = self.prm_engine.score_rows(self._paths.rows(items))
        return [self._paths.path_rewards(it, r) for it, r in zip(items, rewards)], seconds

    # ------------------------------------------------------------------ clock and memory
    def make_clock(self) -> WallClock:
        return WallClock(None)

    def kv_blocks(self, block_size: int) -> int:
        return self.gen.blocks.num_blocks if self.gen is not None else 0

    def prm_kv_blocks(self, block_size: int) -> int:
        return 0  # no PRM prefix cache on vLLM

    def bytes_per_block(self, block_size: int) -> int:
        return self._gen_bytes * block_size

    def prm_bytes_per_block(self, block_size: int) -> int:
        return self._prm_bytes * block_size
