"""What vLLM itself did in each iteration, read from its scheduler (in-process core).

``SchedulerProbe`` wraps the scheduler's ``schedule`` (the engine core calls it once per
``LLMEngine.step``) and keeps the last ``SchedulerOutput``: tokens scheduled per
request, each scheduled request's tokens already computed before the iteration (its
prefix-cache hit when new or resumed, its context so far when decoding), requests resumed
after a preemption, requests preempted. ``VLLMBlocks`` shows
vLLM's KV block pool with the attributes the Server and the recorder read from our
``BlockManager`` (free / used / peak / total blocks), so KV figures and admission mean
the same on every engine: blocks of ``engine.block_size`` tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def engine_core(llm):
    """The in-process EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = getattr(llm.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError(
            "vLLM engine core is not in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before starting the engine"
        )
    return core


@dataclass
class IterationCounts:
    scheduled: dict[str, int] = field(default_factory=dict)  # request id (vLLM's) -> tokens this iteration
    new: set[str] = field(default_factory=set)  # requests scheduled for the first time
    resumed: set[str] = field(default_factory=set)  # requests resumed after a preemption
    preempted: int = 0
    total_tokens: int = 0
    kv_used_blocks: int = 0  # blocks held by requests right after scheduling (the iteration's peak)
    # request id -> tokens computed before this iteration (vLLM's num_computed_tokens at
    # schedule time: the prefix-cache hit of a new or resumed request, the KV a decode row
    # reads). The cost features of the iteration (specscale.engine.vllm.replay) need it.
    computed: dict[str, int] = field(default_factory=dict)


class SchedulerProbe:
    def __init__(self, llm) -> None:
        self.scheduler = engine_core(llm).scheduler
        self._pool = self.scheduler.kv_cache_manager.block_pool
        self._schedule = self.scheduler.schedule
        self.scheduler.schedule = self._wrapped  # instance attribute: this engine only
        self.last = IterationCounts()

    def _wrapped(self, *args, **kwargs):
        out = self._schedule(*args, **kwargs)
        preempted = len(out.preempted_req_ids or ())
        cached = out.scheduled_cached_reqs
        # Both lists carry num_computed_tokens as it was before this iteration (vLLM advances
        # the requests' counters only after building the SchedulerOutput).
        computed = {r.req_id: int(r.num_computed_tokens) for r in out.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, map(int, cached.num_computed_tokens)))
        self.last = IterationCounts(
            dict(out.num_scheduled_tokens), {r.req_id for r in out.scheduled_new_reqs},
            set(out.scheduled_cached_reqs.resumed_req_ids), preempted,
            int(out.total_num_scheduled_tokens),
            self._pool.num_gpu_blocks - 1 - self._pool.get_num_free_blocks(), computed,
        )
        return out

    def take(self) -> IterationCounts:
        last, self.last = self.last, IterationCounts()
        return last


class VLLMBlocks:
    """vLLM's generator KV pool seen as a block manager (read-only)."""

    def __init__(self, llm, block_size: int) -> None:
        self._pool = engine_core(llm).scheduler.kv_cache_manager.block_pool
        self.block_size = block_size
        # vLLM keeps one null block out of the pool.
        self.num_blocks = self._pool.num_gpu_blocks - 1
        self.peak_used = 0
        self.prefix_caching = True

    @property
    def num_free(self) -> int:
        return self._pool.get_num_free_blocks()

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def observe(self, used: int) -> None:
        self.peak_used = max(self.peak_used, used, self.num_used)
