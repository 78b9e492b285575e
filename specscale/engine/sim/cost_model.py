"""Roofline cost model: batch description -> modelled seconds on one GPU.

The simulated backend asks this module how long one generation iteration or one
PRM batch takes, and how many KV tokens fit. It is a MODEL, not a measurement:

    time = fixed overhead + max(bytes moved / achievable bandwidth,
                                FLOPs / achievable FLOP/s at this batch size)

* Bytes: the weights streamed once per forward pass (shared by every row in the
  batch), the KV cache read by attention, and the KV written for new tokens.
* FLOPs: 2 per weight per token for the decoder GEMMs, the head only on rows whose
  output is used, and causal attention (QK^T + PV), see ModelDims.attention_flops.
* Small batches cannot fill the tensor cores: achieved FLOP/s is modelled as
  peak * mfu * n / (n + n_half) for n tokens in the pass. This is the saturation the
  paper profiles for its PRM (throughput flattens around 2,048 input tokens on A100).

Every constant is in CostParams with the reason for its default. Nothing here is
fitted to the paper's results; the harness compares policies under one model, so
relative numbers are what matter and absolute ones are indicative.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from specscale.engine.sim.hardware import GIB, HardwareProfile
from specscale.engine.sim.model_dims import ModelDims, dtype_bytes as _dtype_bytes
from specscale.clock import HostCostModel


@dataclass(frozen=True)
class CostParams:
    """Cost-model assumptions (not hardware facts). Defaults and why:"""

    # Host-side scheduling, sampling bookkeeping and kernel launches per generation
    # iteration. Serving engines with CUDA graphs spend a few ms per step on the host
    # at these batch sizes; 4 ms keeps batch-1 decode of a 7B model on A100 near the
    # ~13-15 ms/token engines report.
    gen_iteration_overhead_s: float = 0.004
    # PRM prompt construction, tokenisation and launch per PRM batch (no CUDA graphs
    # for variable-shape prefill). This is the fixed cost LV amortises.
    prm_batch_overhead_s: float = 0.010
    # PRM batch size (tokens) at which achieved FLOP/s is half of peak*mfu: a MODEL
    # guess of GEMM efficiency n/(n+512) (67% at 1,024 tokens, 80% at 2,048), so that
    # tokens/s flattens near ~2k tokens, where the paper profiles its PRM saturating.
    # It is also the calibration's neutral starting value; it was never chosen to match
    # a held-out result (an earlier 128 was, and was dropped for that reason).
    prm_half_efficiency_tokens: float = 512.0
    # Fraction of dense bf16 peak large GEMMs reach in practice (cuBLAS on A100/H100
    # prefill typically achieves 55-70%).
    mfu: float = 0.6
    # Fraction of HBM bandwidth streaming kernels (weights, paged KV) reach (~80%
    # is the usual measured ceiling on A100/H100).
    bandwidth_efficiency: float = 0.8
    # Same saturation idea for the generator's per-iteration token count. Smaller
    # than the PRM's because decode GEMMs are skinny and memory-bound anyway; this
    # only matters once a mixed decode/prefill iteration nears the compute roof.
    gen_half_efficiency_tokens: int = 64
    # Host work, charged to "other" on the virtual clock (specscale/clock.py), as
    # the torch engine's wall clock measures it. Scheduling, sampling bookkeeping and the
    # search per generation iteration: 1 ms is a Python serving loop at ~100s of rows.
    host_iteration_s: float = 0.001
    # Building one PRM task's input (detokenise the step, tokenise it for the PRM, join
    # the prefix): ~0.2 ms for a ~40-token step with a fast tokenizer called from Python.
    host_prm_task_s: float = 0.0002
    # Structural switch: whether PRM input building holds up the serving loop (true: a
    # Python loop tokenizes before the PRM batch launches, as the paper's Fig. 15 "other"
    # share with ~40% tokenization suggests) or overlaps device work (false: not charged).
    host_prm_on_critical_path: bool = True

    def __post_init__(self) -> None:
        if not (0 < self.mfu <= 1 and 0 < self.bandwidth_efficiency <= 1):
            raise ValueError("mfu and bandwidth_efficiency must lie in (0, 1]")
        if min(self.gen_iteration_overhead_s, self.prm_batch_overhead_s, self.host_iteration_s,
               self.host_prm_task_s) < 0:
            raise ValueError("overheads must be non-negative")
        if min(self.prm_half_efficiency_tokens, self.gen_half_efficiency_tokens) < 0:
            raise ValueError("half-efficiency token counts must be non-negative")

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any] | None) -> "CostParams":
        """Missing keys take the defaults; unknown keys raise ValueError naming them."""
        if mapping is None:
            return cls()
        kinds = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(mapping.keys()) - set(kinds))
        if unknown:
            raise ValueError(f"unknown CostParams keys: {unknown}; known: {sorted(kinds)}")
        values = {}
        for k in mapping.keys():
            v = mapping[k]
            if kinds[k] in ("bool", bool):
                if not isinstance(v, bool):
                    raise ValueError(f"engine.cost.{k} must be true or false, got {v!r}")
                values[k] = v
            else:
                values[k] = int(v) if kinds[k] in ("int", int) else float(v)
        return cls(**values)


class CostModel:
    """Modelled durations for one generator + one PRM sharing one GPU."""

    def __init__(
        self,
        generator: ModelDims,
        prm: ModelDims,
        hardware: HardwareProfile,
        params: CostParams | None = None,
        dtype_bytes: int = 2,
        gpu_memory_utilization: float = 0.9,
        prm_kv_fraction: float = 0.3,
        prm_prefix_cache: bool = True,
        prm_max_batch_tokens: int = 8192,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
    ) -> None:
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must lie in (0, 1]")
        if not 0 <= prm_kv_fraction < 1:
            raise ValueError("prm_kv_fraction must lie in [0, 1)")
        self.generator = generator
        self.prm = prm
        self.hardware = hardware
        self.params = params = params or CostParams()
        self.dtype_bytes = dtype_bytes
        self.gpu_memory_utilization = gpu_memory_utilization
        self.prm_kv_fraction = prm_kv_fraction
        self.prm_prefix_cache = prm_prefix_cache
        self.prm_max_batch_tokens = prm_max_batch_tokens
        self.max_num_batched_tokens = max_num_batched_tokens  # the generator's largest forward (activations)
        self.max_num_seqs = max_num_seqs  # rows whose logits one iteration holds

        # Per-model constants, cached: generation_seconds runs every engine iteration.
        self._bw = hardware.hbm_bandwidth_bytes_s * params.bandwidth_efficiency
        self._flops = hardware.bf16_flops * params.mfu
        g, p, b = generator, prm, dtype_bytes
        self._g_body_bytes = g.body_read_bytes(b)
        self._g_head_bytes = g.head_read_bytes(b)
        self._g_embed_row_bytes = g.hidden_size * b  # embedding gather per token
        self._g_kv = g.kv_bytes_per_token(b)
        self._g_mm = g.matmul_flops_per_token
        self._g_head_flops = g.lm_head_flops_per_row
        self._g_attn = g.attention_flops_per_query_key
        self._g_half = params.gen_half_efficiency_tokens
        self._g_overhead = params.gen_iteration_overhead_s
        self._p_fixed_bytes = p.body_read_bytes(b) + p.head_read_bytes(b)
        self._p_embed_row_bytes = p.hidden_size * b
        self._p_kv = p.kv_bytes_per_token(b)
        # The PRM head runs on every new position (Qwen2.5-Math-PRM's classifier is
        # applied to the whole sequence; the Llama PRM's two logits are cheap anyway).
        self._p_flops_per_token = p.matmul_flops_per_token + p.lm_head_flops_per_row
        self._p_attn = p.attention_flops_per_query_key
        self._p_half = params.prm_half_efficiency_tokens
        self._p_overhead = params.prm_batch_overhead_s

    @classmethod
    def from_configs(
        cls,
        model_cfg: Mapping[str, Any],
        hardware_cfg: Mapping[str, Any],
        cost_cfg: Mapping[str, Any] | None = None,
        prm_prefix_cache: bool = True,
        prm_max_batch_tokens: int = 8192,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
    ) -> "CostModel":
        """From a conf/model/*.yaml node, a conf/hardware/*.yaml node and optional CostParams keys."""
        memory = model_cfg.get("memory", None) or {}
        return cls(
            generator=ModelDims.from_config(model_cfg["generator"]),
            prm=ModelDims.from_config(model_cfg["prm"]),
            hardware=HardwareProfile.from_config(hardware_cfg),
            params=CostParams.from_config(cost_cfg),
            dtype_bytes=_dtype_bytes(model_cfg.get("dtype", "bfloat16")),
            gpu_memory_utilization=float(memory.get("gpu_memory_utilization", 0.9)),
            prm_kv_fraction=float(memory.get("prm_kv_fraction", 0.3)),
            prm_prefix_cache=prm_prefix_cache,
            prm_max_batch_tokens=prm_max_batch_tokens,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )

    def host_model(self) -> HostCostModel:
        """Modelled host seconds per generation iteration and per PRM task (the virtual
        clock's "other"); zero per task when PRM input building overlaps device work."""
        p = self.params
        return HostCostModel(p.host_iteration_s, p.host_prm_task_s if p.host_prm_on_critical_path else 0.0)

    # ---- generation ---------------------------------------------------------------

    def generation_roofline(
        self,
        decode_ctx_lens: np.ndarray | Sequence[int],
        prefill_chunks: Sequence[tuple[int, int]],
        n_logit_rows: int,
    ) -> tuple[float, float]:
        """(memory-bound seconds, compute-bound seconds) of one iteration, no overhead.

        decode_ctx_lens: one entry per decode row, its context length including the
        token being processed. prefill_chunks: (n_new, n_cached) per prefill chunk.
        n_logit_rows: rows that need next-token logits (the LM head runs only there).
        """
        n_dec = len(decode_ctx_lens)
        if n_dec:
            ctx = decode_ctx_lens
            sum_ctx = int(ctx.sum()) if isinstance(ctx, np.ndarray) else sum(ctx)
        else:
            sum_ctx = 0
        n_pref = cached = pairs = 0
        for n_new, c in prefill_chunks:
            n_pref += n_new
            cached += c
            pairs += n_new * c + n_new * (n_new + 1) // 2
        tokens = n_dec + n_pref
        if tokens == 0:
            if n_logit_rows:
                raise ValueError("n_logit_rows > 0 in an iteration with no tokens")
            return 0.0, 0.0
        if n_logit_rows > tokens or n_logit_rows < 0:
            raise ValueError(f"n_logit_rows={n_logit_rows} outside [0, {tokens}] tokens")
        kv = self._g_kv
        nbytes = (
            self._g_body_bytes
            + (self._g_head_bytes if n_logit_rows else 0)
            + tokens * (self._g_embed_row_bytes + kv)  # embedding gather + KV write
            + (sum_ctx + cached) * kv                  # KV read by attention
        )
        flops = (
            self._g_mm * tokens
            + self._g_head_flops * n_logit_rows
            + self._g_attn * (sum_ctx + pairs)
        )
        # flops / (peak*mfu * n/(n+n_half))
        compute_s = flops * (tokens + self._g_half) / (self._flops * tokens)
        return nbytes / self._bw, compute_s

    def generation_seconds(
        self,
        decode_ctx_lens: np.ndarray | Sequence[int],
        prefill_chunks: Sequence[tuple[int, int]],
        n_logit_rows: int,
    ) -> float:
        """Modelled seconds of one generation iteration (0.0 if it has no tokens)."""
        mem_s, comp_s = self.generation_roofline(decode_ctx_lens, prefill_chunks, n_logit_rows)
        if mem_s == 0.0:
            return 0.0
        return self._g_overhead + (mem_s if mem_s > comp_s else comp_s)

    def decode_roofline_fraction(self, batch: int, ctx: int) -> float:
        """compute_s / max(compute_s, memory_s) for a pure decode step of `batch` rows
        at context `ctx`: 1.0 means compute-bound, small means memory-bound."""
        mem_s, comp_s = self.generation_roofline(np.full(batch, ctx, dtype=np.int64), (), batch)
        return comp_s / max(mem_s, comp_s)

    # ---- verification -------------------------------------------------------------

    def prm_roofline(self, tasks: Sequence[tuple[int, int]]) -> tuple[float, float]:
        """(memory-bound seconds, compute-bound seconds) of one PRM batch, no overhead."""
        n = cached = pairs = 0
        for n_new, c in tasks:
            if n_new < 0 or c < 0:
                raise ValueError(f"PRM task ({n_new}, {c}) has a negative length")
            n += n_new
            cached += c
            pairs += n_new * c + n_new * (n_new + 1) // 2
        return self._prm_roofline_of(n, cached, pairs)

    def _prm_roofline_of(self, n: float, cached: float, pairs: float) -> tuple[float, float]:
        """The roofline of a batch given its sums: new tokens, cached tokens read, and
        (query, key) pairs of attention."""
        if n == 0:
            return 0.0, 0.0
        kv = self._p_kv
        nbytes = self._p_fixed_bytes + n * (self._p_embed_row_bytes + kv) + cached * kv
        flops = self._p_flops_per_token * n + self._p_attn * pairs
        compute_s = flops * (n + self._p_half) / (self._flops * n)
        return nbytes / self._bw, compute_s

    def prm_seconds_groups(self, groups: Sequence[tuple[int, float, float]]) -> float:
        """``prm_seconds`` of a batch given as (count, new tokens, cached) groups of equal
        tasks: O(groups) instead of O(tasks), for the adaptive rule's per-iteration pricing."""
        n = cached = pairs = 0.0
        for k, n_new, c in groups:
            n += k * n_new
            cached += k * c
            pairs += k * (n_new * c + n_new * (n_new + 1) // 2)
        mem_s, comp_s = self._prm_roofline_of(n, cached, pairs)
        if mem_s == 0.0:
            return 0.0
        return self._p_overhead + (mem_s if mem_s > comp_s else comp_s)

    def prm_seconds(self, tasks: Sequence[tuple[int, int]]) -> float:
        """Modelled seconds of one PRM batch (prefill only).

        Each task is (n_new_tokens, n_cached_ctx): the PRM input tokens not yet in
        the PRM's KV cache, after a cached prefix. Empty batch (or no new tokens): 0.0.
        """
        mem_s, comp_s = self.prm_roofline(tasks)
        if mem_s == 0.0:
            return 0.0
        return self._p_overhead + (mem_s if mem_s > comp_s else comp_s)

    # ---- memory -------------------------------------------------------------------

    def kv_capacity_tokens(self) -> tuple[int, int]:
        """(generator KV tokens, PRM KV tokens) that fit beside both models' weights and
        both models' activation workspace.

        usable = memory * gpu_memory_utilization - generator and PRM weights
                 - generator and PRM activation workspace (``activation_bytes``),
        as a vLLM-style engine sizes its pool after a profiling forward of its largest
        batch. The usable bytes are split (1 - prm_kv_fraction) : prm_kv_fraction between
        the generator's and the PRM's KV pools when the PRM keeps a prefix cache; without
        it the PRM has no KV pool and the generator gets all of it.
        """
        b = self.dtype_bytes
        budget = int(self.hardware.memory_bytes * self.gpu_memory_utilization)
        w_gen, w_prm = self.generator.weight_bytes(b), self.prm.weight_bytes(b)
        act_gen, act_prm = self.activation_bytes()
        usable = budget - w_gen - w_prm - act_gen - act_prm
        if usable <= 0:
            raise ValueError(
                f"model weights and activations do not fit on {self.hardware.name}: generator "
                f"{w_gen / GIB:.1f} GiB + PRM {w_prm / GIB:.1f} GiB of weights and {(act_gen + act_prm) / GIB:.1f} "
                f"GiB of activations exceed the usable {budget / GIB:.1f} GiB ({self.gpu_memory_utilization:.0%} of "
                f"{self.hardware.memory_bytes / GIB:.1f} GiB); no room for KV cache"
            )
        if not self.prm_prefix_cache:
            return usable // self._g_kv, 0
        prm_bytes = int(usable * self.prm_kv_fraction)
        gen_bytes = usable - prm_bytes
        return gen_bytes // self._g_kv, prm_bytes // self._p_kv

    def activation_bytes(self) -> tuple[int, int]:
        """(generator, PRM) peak activation workspace. MODEL: the live tensors of one
        decoder layer for the largest forward (layers run one after another): residual,
        normed input, q/k/v/o and the MLP's gate/up/act per token, for
        ``max_num_batched_tokens`` (generator) and ``prm_max_batch_tokens`` (PRM) tokens;
        plus the generator's float32 logits of ``max_num_seqs`` rows for sampling."""
        b = self.dtype_bytes

        def per_token(m: ModelDims) -> int:
            return (4 * m.hidden_size + 3 * m.intermediate_size) * b

        gen = self.max_num_batched_tokens * per_token(self.generator) + self.max_num_seqs * self.generator.vocab_size * 4
        return gen, self.prm_max_batch_tokens * per_token(self.prm)

    def kv_capacity_blocks(self, block_size: int) -> tuple[int, int]:
        """(generator, PRM) KV blocks of `block_size` tokens each."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        gen, prm = self.kv_capacity_tokens()
        return gen // block_size, prm // block_size
