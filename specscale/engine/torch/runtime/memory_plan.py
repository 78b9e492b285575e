"""The torch engine's memory plan: the generator's KV pool and the PRM's (docs/design.md §6).

Both models' weights are loaded first. Then, on CUDA (vLLM-style accounting):

* activation reserve: a profile run measures the peak memory that the largest
  iterations need above the weights: one no-cache PRM forward of
  ``engine.prm_max_batch_tokens`` tokens and one generator prefill of
  ``engine.max_num_batched_tokens`` tokens (over a temporary KV pool, so the attention
  path is the serving one) with the logits of ``engine.max_num_seqs`` rows, read from
  ``torch.cuda.max_memory_allocated``;
* usable = total * ``model.memory.gpu_memory_utilization`` - memory in use after the
  profile (weights, the CUDA context, anything else on the device), less the reserve;
* ``engine.prm_prefix_cache=true``: the PRM pool gets ``model.memory.prm_kv_fraction`` of
  it (in PRM blocks), the generator the rest; false: no PRM pool, the generator gets it
  all (the PRM's share is the measured activation headroom of its largest batch).

``engine.kv_blocks`` / ``engine.prm_kv_blocks`` fix a pool's size; the other pool (if
any, and null) gets what the usable memory leaves after it. With every pool fixed
nothing is probed. On the CPU there is no probing: ``engine.cpu_kv_blocks`` and
``engine.cpu_prm_kv_blocks`` (the PRM pool only with the cache on).

The generator pool's hidden scratch block (decode-graph padding rows) comes out of the
generator's share and is not counted in ``gen_blocks``. Decode-graph memory (captured
after the pools, during warm-up) is not reserved: the (1 - utilisation) margin covers it.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch

from specscale.settings.search_policy import ConfigError
from specscale.engine.torch.attention.kv_cache import PagedKVCache

logger = logging.getLogger(__name__)

GIB = float(2**30)
DEFAULT_CPU_KV_BLOCKS = 4096
DEFAULT_CPU_PRM_KV_BLOCKS = 1024


@dataclass(frozen=True)
class MemoryPlan:
    """Sizes of the two KV pools (blocks of ``block_size`` tokens) and where they came from.

    source: "cuda" (measured: profile run + free memory), "cpu" (engine.cpu_kv_blocks /
    cpu_prm_kv_blocks), "config" (every pool fixed by engine.kv_blocks / prm_kv_blocks).
    prm_blocks = 0: no PRM pool (engine.prm_prefix_cache=false)."""

    gen_blocks: int
    gen_bytes_per_block: int
    prm_blocks: int
    prm_bytes_per_block: int
    activation_reserve_bytes: int
    source: str
    prm_prefix_cache: bool = True
    block_size: int = 16
    usable_bytes: int = 0  # CUDA: total * utilisation - in use, before the activation reserve

    @property
    def gen_bytes(self) -> int:
        return self.gen_blocks * self.gen_bytes_per_block

    @property
    def prm_bytes(self) -> int:
        return self.prm_blocks * self.prm_bytes_per_block

    def as_dict(self) -> dict[str, Any]:
        """Flat record for a summary (blocks, bytes per block, pool bytes, reserve, source)."""
        return {**asdict(self), "gen_bytes": self.gen_bytes, "prm_bytes": self.prm_bytes}

    def describe(self) -> str:
        prm = (f"PRM {self.prm_blocks} blocks ({self.prm_bytes / GIB:.2f} GiB)" if self.prm_blocks
               else "no PRM pool")
        return (f"KV memory ({self.source}): generator {self.gen_blocks} blocks ({self.gen_bytes / GIB:.2f} GiB), "
                f"{prm}, activation reserve {self.activation_reserve_bytes / GIB:.2f} GiB")


def model_dtype(model) -> torch.dtype:
    """The dtype a model's weights (and so its KV cache) are in."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next(model.model.parameters()).dtype


def _positive(eng: Mapping[str, Any], key: str) -> int | None:
    value = eng.get(key)
    if value is None:
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or n != value:
        raise ConfigError(f"engine.{key}={value!r}: give a positive number of KV blocks (or null)")
    return n


def split_usable(
    usable_bytes: int,
    activation_bytes: int,
    gen_bytes_per_block: int,
    prm_bytes_per_block: int,
    *,
    prm_cache: bool,
    prm_fraction: float,
    gen_fixed: int | None = None,
    prm_fixed: int | None = None,
    gen_extra_blocks: int = 0,
    where: str = "",
) -> tuple[int, int]:
    """(generator blocks, PRM blocks) from the usable bytes (pure arithmetic: the CUDA
    plan after probing). The activation reserve comes off first; a fixed pool takes its
    bytes; with both free and the cache on the PRM gets ``prm_fraction`` of the rest.
    gen_extra_blocks: generator blocks outside the count (the scratch block)."""
    avail = int(usable_bytes) - int(activation_bytes)
    reserve = f"activation reserve {activation_bytes / GIB:.2f} GiB" + (f"; {where}" if where else "")
    fixes = ("raise model.memory.gpu_memory_utilization, lower engine.max_num_batched_tokens / "
             "engine.prm_max_batch_tokens, or use smaller models")
    if prm_cache:
        if prm_fixed is not None:
            prm_blocks = prm_fixed
        elif gen_fixed is not None:
            prm_blocks = (avail - (gen_fixed + gen_extra_blocks) * gen_bytes_per_block) // prm_bytes_per_block
        else:
            prm_blocks = int(max(avail, 0) * prm_fraction) // prm_bytes_per_block
        if prm_blocks < 1:
            raise ConfigError(
                f"no GPU memory left for the PRM's KV cache (engine.prm_prefix_cache=true): usable "
                f"{usable_bytes / GIB:.2f} GiB, {reserve}"
                + (f", generator pool engine.kv_blocks={gen_fixed}" if gen_fixed is not None else "")
                + f"; {fixes}, raise model.memory.prm_kv_fraction, set engine.prm_kv_blocks, lower "
                "engine.kv_blocks, or set engine.prm_prefix_cache=false"
            )
    else:
        prm_blocks = 0
    if gen_fixed is not None:
        return gen_fixed, prm_blocks
    gen_blocks = (avail - prm_blocks * prm_bytes_per_block) // gen_bytes_per_block - gen_extra_blocks
    if gen_blocks < 1:
        raise ConfigError(
            f"no GPU memory left for the generator's KV cache: usable {usable_bytes / GIB:.2f} GiB, {reserve}"
            + (f", PRM pool {prm_blocks} blocks ({prm_blocks * prm_bytes_per_block / GIB:.2f} GiB)"
               if prm_blocks else "")
            + f"; {fixes}"
            + (", or lower model.memory.prm_kv_fraction / engine.prm_kv_blocks" if prm_blocks else "")
            + ", or set engine.kv_blocks"
        )
    return gen_blocks, prm_blocks


def dummy_prm_inputs(prm, tokens: int) -> list:
    """In-vocabulary PRM inputs of ``tokens`` tokens in all, each within the PRM's window
    (one reward position at its end): one packed PRM batch of that many tokens."""
    from specscale.engine.text.prm_format import PRMInput

    g = torch.Generator().manual_seed(1)
    out = []
    while tokens > 0:
        n = min(tokens, prm.max_model_len)
        ids = torch.randint(0, prm.config.vocab_size, (n,), generator=g).tolist()
        out.append(PRMInput(tuple(ids), (n - 1,)))
        tokens -= n
    return out


def allocate_profile_pool(runner, prefill_tokens: int) -> None:
    """Replace the generator's KV pool by one of exactly the blocks the profile's prefill
    writes (size the real pool afterwards)."""
    runner.allocate_kv_cache(max(1, -(-prefill_tokens // runner.block_size)))


@torch.inference_mode()
def profile_forwards(runner, prm, prefill_tokens: int, prm_tokens: int, logit_rows: int | None) -> None:
    """The profile run's work (any device; after ``allocate_profile_pool``): one no-cache
    PRM forward of ``prm_tokens`` tokens, then one generator prefill of ``prefill_tokens``
    tokens with the logits of ``logit_rows`` rows."""
    if prm_tokens > 0:
        prm.score_token_ids(dummy_prm_inputs(prm, prm_tokens))
    if prefill_tokens > 0:
        runner.dummy_prefill(prefill_tokens, logit_rows)


def measure_cuda(runner, prm, prefill_tokens: int, prm_tokens: int, logit_rows: int | None,
                 utilization: float) -> tuple[int, int, int, int]:
    """(usable bytes, activation peak bytes, free, total) on the runner's CUDA device:
    the peak of ``profile_forwards`` above what was allocated before it (weights and the
    profile's own KV pool), then total * utilization - memory in use once the profile's
    memory is released (this counts non-torch memory the forwards created too)."""
    dev = runner.device
    allocate_profile_pool(runner, prefill_tokens)
    torch.cuda.synchronize(dev)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.cuda.device(dev):
        profile_forwards(runner, prm, prefill_tokens, prm_tokens, logit_rows)
    torch.cuda.synchronize(dev)
    activation = max(0, torch.cuda.max_memory_allocated(dev) - base)
    runner.allocate_kv_cache(1)  # release the profile's pool
    # Loading freed memory too (fused projections replace the per-projection weights); the
    # caching allocator keeps it reserved, which mem_get_info would count as in use.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    usable = int(total * utilization - (total - free))
    return usable, int(activation), int(free), int(total)


def plan_memory(cfg: Mapping[str, Any], runner, prm, scratch_block: bool = False) -> MemoryPlan:
    """The memory plan of this config on the runner's device (see the module docstring).
    On CUDA with a pool left to size this runs the profile (the generator's KV pool is
    replaced by a 1-block one meanwhile: allocate the planned pools next)."""
    eng, memory = cfg["engine"], cfg["model"].get("memory") or {}
    block_size = runner.block_size
    prm_cache = bool(eng.get("prm_prefix_cache", True))
    gen_fixed, prm_fixed = _positive(eng, "kv_blocks"), _positive(eng, "prm_kv_blocks")
    if prm_fixed is not None and not prm_cache:
        logger.warning("engine.prm_kv_blocks=%d is ignored: engine.prm_prefix_cache=false (no PRM KV pool)", prm_fixed)
        prm_fixed = None
    gen_bpb = PagedKVCache.bytes_per_block(runner.config, block_size, runner.dtype)
    prm_bpb = PagedKVCache.bytes_per_block(prm.config, block_size, model_dtype(prm)) if prm is not None else 0
    common = dict(gen_bytes_per_block=gen_bpb, prm_bytes_per_block=prm_bpb, prm_prefix_cache=prm_cache,
                  block_size=block_size)
    if gen_fixed is not None and (prm_fixed is not None or not prm_cache):
        return MemoryPlan(gen_fixed, prm_blocks=prm_fixed or 0, activation_reserve_bytes=0, source="config", **common)
    if runner.device.type != "cuda":
        gen = gen_fixed if gen_fixed is not None else _positive(eng, "cpu_kv_blocks") or DEFAULT_CPU_KV_BLOCKS
        prm_blocks = 0
        if prm_cache:
            prm_blocks = prm_fixed if prm_fixed is not None else (
                _positive(eng, "cpu_prm_kv_blocks") or DEFAULT_CPU_PRM_KV_BLOCKS)
        return MemoryPlan(gen, prm_blocks=prm_blocks, activation_reserve_bytes=0, source="cpu", **common)

    util = float(memory.get("gpu_memory_utilization", 0.9))
    fraction = float(memory.get("prm_kv_fraction", 0.3))
    if not 0 < util <= 1:
        raise ConfigError(f"model.memory.gpu_memory_utilization={util}: give a share of GPU memory in (0, 1]")
    if prm_cache and not 0 < fraction < 1:
        raise ConfigError(f"model.memory.prm_kv_fraction={fraction}: give a share in (0, 1) "
                          "(or set engine.prm_kv_blocks, or engine.prm_prefix_cache=false)")
    prefill_tokens = int(eng.get("max_num_batched_tokens") or 0)
    prm_tokens = int(eng.get("prm_max_batch_tokens") or 0)
    logit_rows = int(eng.get("max_num_seqs") or 0) or None
    usable, activation, free, total = measure_cuda(runner, prm, prefill_tokens, prm_tokens, logit_rows, util)
    logger.info("memory profile: activation peak %.2f GiB (PRM batch %d tokens, prefill %d tokens); "
                "%.1f GiB free of %.1f GiB, usable %.2f GiB at utilisation %.2f",
                activation / GIB, prm_tokens, prefill_tokens, free / GIB, total / GIB, usable / GIB, util)
    where = (f"{free / GIB:.1f} GiB free of {total / GIB:.1f} GiB after the weights, "
             f"model.memory.gpu_memory_utilization={util}")
    gen, prm_blocks = split_usable(
        usable, activation, gen_bpb, prm_bpb, prm_cache=prm_cache, prm_fraction=fraction, gen_fixed=gen_fixed,
        prm_fixed=prm_fixed, gen_extra_blocks=1 if scratch_block else 0, where=where,
    )
    return MemoryPlan(gen, prm_blocks=prm_blocks, activation_reserve_bytes=activation, source="cuda",
                      usable_bytes=usable, **common)


def allocate_pools(plan: MemoryPlan, runner, prm, scratch_block: bool = False) -> None:
    """Allocate the planned pools: the generator's (plus its scratch block) and, when the
    plan has one, the PRM's. Records the plan on the runner (``runner.memory_plan``)."""
    runner.allocate_kv_cache(plan.gen_blocks, scratch_block=scratch_block)
    if plan.prm_blocks:
        prm.allocate_kv_cache(plan.prm_blocks, plan.block_size)
    runner.memory_plan = plan
    logger.info(plan.describe())
