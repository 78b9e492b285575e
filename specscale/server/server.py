"""The Server: admission and the event loop that picks the next engine iteration.

Each iteration is either one generation step (every runnable physical sequence
advances; new prompts prefill) or one PRM batch. Time comes from the backend's clock
(specscale/clock.py): the wall clock of the whole serving loop on torch, a
virtual clock advanced by modelled device and host seconds on the sim. Which part of
each PRM task is read from the PRM's prefix cache is planned here, by ``PRMCache``, the
same for every backend.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Callable, Optional

from specscale.settings.search_policy import PolicyConfig, SearchConfig
from specscale.engine.backend import Backend
from specscale.engine.generation import KVCapacityError
from specscale.engine.scheduler import EngineLimits
from specscale.hashing import root_key
from specscale.engine.prm_cache import PRMCache
from specscale.engine.sampler import SamplingParams
from specscale.metrics.recorder import Recorder
from specscale.search.candidate import Candidate, Status
from specscale.search.controller import RequestSearch
from specscale.server.request import Request
from specscale.verify.adaptive_monitor import AdaptiveMonitor
from specscale.verify.queue import TRIGGER_IDLE, TRIGGER_MEMORY, VerifyQueue
from specscale.verify.task import VerifyTask


class SchedulerStalled(RuntimeError):
    """Active requests remain but nothing can make progress (a bug, never a result)."""


class Server:
    def __init__(
        self,
        backend: Backend,
        search: SearchConfig,
        policy: PolicyConfig,
        requests: list[Request],
        concurrency: int,
        seed: int,
        limits: EngineLimits = EngineLimits(),
        kv_blocks: Optional[int] = None,
        prm_prefix_cache: bool = True,
        prm_kv_blocks: Optional[int] = None,
        prefix_caching: bool = True,
        recorder: Optional[Recorder] = None,
        on_request_done: Optional[Callable[[Request], None]] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.backend = backend
        self.search_cfg = search
        self.policy = policy
        self.concurrency = concurrency
        self.seed = seed
        self.prm_prefix_cache = prm_prefix_cache
        self._clock = backend.make_clock()
        sampling = SamplingParams(search.temperature, search.top_p)
        # The harness's scheduler over the backend's forwards (sim, torch), or an engine with
        # its own scheduler and KV (vLLM), whose blocks are a view of its pool (kv_blocks and
        # prefix_caching are then its own).
        self.gen = backend.make_generation_side(sampling, limits, search.step_token_cap, search.path_token_cap,
                                                policy.dedup, kv_blocks=kv_blocks, prefix_caching=prefix_caching)
        self.blocks = self.gen.blocks
        if prm_prefix_cache and prm_kv_blocks is None:
            prm_kv_blocks = backend.prm_kv_blocks(limits.block_size)
        self.prm_cache = PRMCache(
            prm_prefix_cache, int(prm_kv_blocks or 0), limits.block_size, backend.prm_path_tokens,
            int(backend.prm_closing_tokens), search.expansion,
        )
        # Adaptive verification prices each flush with the backend's PRM cost model where it
        # has one (sim), else with a fit of PRM batches timed at start-up and in this run (torch).
        self.adaptive: Optional[AdaptiveMonitor] = None
        decide = None
        if policy.verification == "adaptive":
            self.adaptive = AdaptiveMonitor(backend.prm_cost, limits.block_size, search.keep,
                                            policy.pruning, profile=backend.prm_profile,
                                            prm_cost_groups=backend.prm_cost_groups)
            decide = self._adaptive_flush
        self.queue = VerifyQueue(policy, decide)
        self.recorder = recorder if recorder is not None else Recorder()
        self._on_request_done = on_request_done
        self._ids = itertools.count()
        self._admits = itertools.count()
        self.waiting: deque[Request] = deque(sorted(requests, key=lambda r: (r.arrival, r.request_id)))
        self.active: dict[int, Request] = {}
        self.finished: list[Request] = []
        self._prefilling: dict[int, RequestSearch] = {}  # root sequence sid -> its search

    @property
    def clock(self) -> float:
        """Seconds since the serving loop started (wall or virtual, see clock.py)."""
        return self._clock.now()

    # ------------------------------------------------------------------ SearchOps
    def now(self) -> float:
        return self.clock

    def start_children(self, parent: Candidate, children: list[Candidate]) -> None:
        self.gen.start_children(parent, children, self.clock)

    def cancel(self, cand: Candidate) -> None:
        if cand.status is Status.RUNNING or (cand.position is None and cand.score is None):
            self.recorder.on_cancel(cand, self.clock)
        self.queue.drop(cand)
        self.gen.remove_member(cand)
        self.prm_cache.discard(cand)

    def discard(self, cand: Candidate) -> None:
        """cand will never be extended (pruned or not selected): its PRM prefix can go."""
        self.prm_cache.discard(cand)

    def release(self, cand: Candidate) -> None:
        if cand.holds_kv:
            self.gen.remove_member(cand)

    def round_complete(self, request_id: int, round_index: int) -> None:
        self.queue.round_complete(request_id, round_index)

    def sibling_group_complete(self, request_id: int, round_index: int, parent_cid: int) -> None:
        self.queue.sibling_group_complete(request_id, round_index, parent_cid)

    def request_finished(self, search: RequestSearch) -> None:
        req = self.active.pop(search.request_id)
        req.finish_time = self.clock
        self.prm_cache.release_request(search.request_id)
        self.finished.append(req)
        self.recorder.on_request_done(req)
        if self._on_request_done is not None:
            self._on_request_done(req)

    # ------------------------------------------------------------------ loop
    def run(self) -> Recorder:
        self._clock.start()
        while self.waiting or self.active:
            self._admit()
            due = self.queue.due(self.clock)
            if due is not None:
                self._verify(*due)
            elif self.gen.has_work():
                try:
                    self._generate()
                except KVCapacityError:
                    if not self.queue.pending:
                        raise
                    self._verify(TRIGGER_MEMORY, self.queue.take_all())  # scores free memory
            elif self.queue.pending:
                self._verify(TRIGGER_IDLE, self.queue.take_all())
            elif self.waiting and len(self.active) < self.concurrency and self.waiting[0].arrival > self.clock:
                gap = self.waiting[0].arrival - self.clock
                self.recorder.idle_s += gap
                self._clock.skip(gap)
            elif self.active or self.waiting:
                raise SchedulerStalled(self._diagnose())
        self.recorder.finish(self, self._clock.stop())
        return self.recorder

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.concurrency and self.waiting[0].arrival <= self.clock:
            req = self.waiting[0]
            prompt = req.prompt if req.prompt is not None else self.backend.prompt_tokens(req.problem)
            need = -(-len(prompt) // self.blocks.block_size) + 1
            if self.active and self.blocks.num_free < need:
                return  # wait for memory; running requests will free it
            self.waiting.popleft()
            req.prompt = prompt
            req.admit_time = self.clock
            self._start_request(req)

    def _start_request(self, req: Request) -> None:
        rid = req.request_id
        seq = self.gen.add_prompt(rid, next(self._admits), req.prompt)
        root = Candidate(
            cid=next(self._ids), key=root_key(self.seed, rid), request_id=rid, round=-1, child_index=0,
            parent=None, path_tokens_before=0, status=Status.DONE, holds_kv=True, phys=seq,
            start_time=self.clock, end_time=self.clock,
        )
        seq.holders = 1
        search = RequestSearch(
            rid, root, self.search_cfg, self.policy, self, self._ids, self.backend.answer, self.backend.equivalent,
        )
        req.search = search
        self.active[rid] = req
        if seq.num_cached >= seq.target_cached:
            search.start()
        else:
            self._prefilling[seq.sid] = search

    def _adaptive_flush(self, queue: VerifyQueue) -> bool:
        return self.adaptive.decide(queue.pending.values(), queue.pending_tokens, self._search_of,
                                    self.blocks.num_free)

    def _search_of(self, request_id: int) -> Optional[RequestSearch]:
        req = self.active.get(request_id)
        return req.search if req is not None else None

    def _generate(self) -> None:
        t0 = self.clock
        enqueued = self.queue.enqueued_tokens
        res = self.gen.step()
        self._clock.device(res.seconds)
        self.queue.on_generation_iteration()  # tasks that waited through this iteration
        for seq in res.prefixes_done:
            self._prefilling.pop(seq.sid).start()
        for seq, group in res.finished:
            for c in group:
                c.end_time = self.clock
            new, total = self._prm_task_tokens(group[0])
            self.queue.add(seq.request_id, group, new, self.clock, input_tokens=total)
        for seq, group in res.finished:
            search = self.active[seq.request_id].search
            for c in group:
                if c.live and not search.done:
                    search.on_step_finished(c)
        if self.adaptive is not None:
            self.adaptive.on_generation(res.seconds, res.logit_rows, res.decode_rows, res.prefill_tokens,
                                        self.queue.enqueued_tokens - enqueued)
        self._clock.host_iteration(res)  # modelled host work of the iteration (virtual clock only)
        self.recorder.on_generation(t0, res, self)

    def _prm_task_tokens(self, c: Candidate) -> tuple[int, int]:
        """A task's PRM tokens for the queue, (new, input). input: its whole scoring input,
        the question, the path and the closing tokens, whatever part its prefix cache holds
        (lazy verification's volume by default). new: with the cache, its step's piece and
        the closing tokens on top of its parent's prefix (the batch plan later counts what
        is really computed)."""
        total = self.backend.prm_path_tokens(c) + self.prm_cache.closing_tokens
        if self.prm_prefix_cache:
            return total - self.backend.prm_path_tokens(c.parent), total
        return total, total

    def _verify(self, trigger: str, tasks: list[VerifyTask]) -> None:
        if not tasks:
            return
        t0 = self.clock
        heads = [t.candidates[0] for t in tasks]
        items = self.prm_cache.plan(heads)
        # modelled host work of the PRM batch (virtual clock only)
        self._clock.host_prm_tasks(len(tasks), items)
        scores, seconds = self.backend.score(items)
        scores = [s for it, s in zip(items, scores) if not it.prefix_only]  # head-wave items have none
        self._clock.device(seconds)
        self.prm_cache.commit(items, {t.candidates[0].cid: t.candidates[1:] for t in tasks if len(t.candidates) > 1})
        self.recorder.on_verify(t0, seconds, trigger, tasks, items)
        if self.adaptive is not None:
            self.adaptive.on_prm_batch(items, seconds)
        for task, step_scores in zip(tasks, scores):
            for c in task.candidates:
                req = self.active.get(c.request_id)
                if req is None or not c.live:
                    continue  # its request ended or it was cancelled earlier in this batch
                req.search.on_scored(c, step_scores)
        if self.adaptive is not None:
            self.adaptive.on_scores(c.score for c in heads)  # the run's score distribution (no oracle)
        self.prm_cache.release_finished_parents(heads)

    def _diagnose(self) -> str:
        lines = [f"t={self.clock:.3f}s active={len(self.active)} waiting={len(self.waiting)} "
                 f"pending_verify={len(self.queue)} free_blocks={self.blocks.num_free}"]
        for req in list(self.active.values())[:4]:
            s = req.search
            rd = s.rounds[-1] if s.rounds else None
            if rd is not None:
                lines.append(
                    f"request {req.request_id}: round {rd.index} unfinished={rd.unfinished} scored={rd.scored}/"
                    f"{len(rd.members)} statuses={[m.status.value for m in rd.members]}"
                )
        return "scheduler stalled: " + "; ".join(lines)
