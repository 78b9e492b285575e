"""Recorder: collects per-iteration, per-PRM-batch, per-round and per-request rows.

It only appends plain dicts while the Server runs; `summary.py` turns them into the
docs/design.md §5 metrics and `writer.py` writes the files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specscale.engine.generation import StepResult


@dataclass
class Recorder:
    iterations: list[dict] = field(default_factory=list)
    verify_batches: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    cancel_lifetimes: list[float] = field(default_factory=list)
    idle_s: float = 0.0
    makespan_s: float = 0.0
    kv_peak_blocks: int = 0
    kv_blocks_total: int = 0
    row_cap: int = 0  # engine.max_num_seqs: rows one generation iteration may hold
    preemptions: int = 0
    prm_stats: Any = None  # PRMCacheStats at the end of the run
    prm_kv_blocks_total: int = 0
    cost_model_extrapolated: Any = None  # sim with a profiled cost model: predictions outside its grid
    profile_speed: dict = field(default_factory=dict)  # sim with a profile: probe ratios (SpeedCheck.summary)
    prefix_hit_tokens: int = 0  # generator prefill tokens re-found in the prefix cache
    recomputed_prefill_tokens: int = 0  # generator tokens prefilled again after preemption

    def on_generation(self, t0: float, res: StepResult, server: Any) -> None:
        self.iterations.append(
            {
                "kind": "generate",
                "t_start": t0,
                "seconds": res.seconds,
                "decode_rows": res.decode_rows,
                "prefill_tokens": res.prefill_tokens,
                "physical_rows": res.logit_rows,
                "rows": res.rows,
                "deferred_rows": res.deferred_rows,
                "logical_draws": res.draws,
                "speculative_rows": res.speculative_rows,
                "forks": res.forks,
                "preempted": res.preempted,
                "steps_finished": sum(len(g) for _, g in res.finished),
                "kv_used_blocks": server.blocks.num_used,
                "live_sequences": server.gen.live_sequences(),
                "pending_verify": len(server.queue),
                "active_requests": len(server.active),
                "prm_tasks": 0,
                "prm_tokens": 0,
                "trigger": None,
            }
        )

    def on_verify(self, t0: float, seconds: float, trigger: str, tasks: list, items: list) -> None:
        tokens = sum(it.n_new for it in items)  # computed PRM input tokens (new tokens only with the cache)
        members = sum(len(t.candidates) for t in tasks)
        self.verify_batches.append(
            {
                "t_start": t0,
                "seconds": seconds,
                "trigger": trigger,
                "n_tasks": len(tasks),
                "n_candidates": members,
                "n_tokens": tokens,
                "n_cached_tokens": sum(it.n_cached for it in items),
                "n_head_wave_tokens": sum(it.n_new for it in items if it.prefix_only),
                "n_tokens_queued": sum(t.n_tokens for t in tasks),
                "max_deferrals": max(t.deferrals for t in tasks),
                "mean_wait_s": sum(t0 - t.enqueue_time for t in tasks) / len(tasks),
            }
        )
        self.iterations.append(
            {
                "kind": "verify", "t_start": t0, "seconds": seconds, "decode_rows": 0, "prefill_tokens": 0,
                "physical_rows": 0, "rows": 0, "deferred_rows": 0, "logical_draws": 0, "speculative_rows": 0, "forks": 0, "preempted": 0,
                "steps_finished": 0, "kv_used_blocks": None, "live_sequences": None, "pending_verify": 0,
                "active_requests": None, "prm_tasks": len(tasks), "prm_tokens": tokens, "trigger": trigger,
            }
        )

    def on_cancel(self, cand: Any, now: float) -> None:
        """A losing branch (running, or finished speculatively and unscored) is cancelled."""
        self.cancel_lifetimes.append(now - cand.start_time)

    def on_request_done(self, req: Any) -> None:
        s = req.search
        final = s.final
        problem = req.problem
        reference = getattr(problem, "answer", None)
        correct = None
        if reference is not None:
            correct = final.weighted is not None and s._equivalent(final.weighted, reference)
        logical = sum(r["logical_tokens"] for r in s.round_records)
        returned = s.returned
        self.rounds.extend(s.round_records)
        self.requests.append(
            {
                "request_id": req.request_id,
                "problem_id": getattr(problem, "id", str(req.request_id)),
                "level": getattr(problem, "level", None),
                "arrival_s": req.arrival,
                "admit_s": req.admit_time,
                "finish_s": req.finish_time,
                "latency_s": req.finish_time - req.arrival,
                "prompt_tokens": len(req.prompt),
                "logical_tokens": logical,
                "output_tokens": returned.path_tokens if returned is not None else 0,
                "rounds": len(s.rounds),
                "finished_paths": len(s.finished),
                "shortcut_rounds": s.shortcut_rounds,
                "answer": _s(final.weighted),
                "answer_best_single": _s(final.best_single),
                "answer_majority": _s(final.majority),
                "reference": _s(reference),
                "correct": correct,
                "correct_best_single": None if reference is None else (
                    final.best_single is not None and s._equivalent(final.best_single, reference)),
                "correct_majority": None if reference is None else (
                    final.majority is not None and s._equivalent(final.majority, reference)),
            }
        )

    def finish(self, server: Any, makespan_s: float) -> None:
        self.makespan_s = makespan_s
        self.prm_stats = server.prm_cache.stats
        self.prm_kv_blocks_total = server.prm_cache.num_blocks if server.prm_cache.enabled else 0
        self.prefix_hit_tokens = server.gen.prefix_hit_tokens
        self.recomputed_prefill_tokens = server.gen.recomputed_prefill_tokens
        self.kv_peak_blocks = server.blocks.peak_used
        self.kv_blocks_total = server.blocks.num_blocks
        self.row_cap = server.gen.limits.max_num_seqs
        self.preemptions = server.gen.total_preemptions
        self.leaked_blocks = server.blocks.num_used
        self.leaked_sequences = server.gen.live_sequences()
        cost = getattr(server.backend, "cost", None)
        self.cost_model_extrapolated = getattr(cost, "extrapolated", None)
        speed = getattr(cost, "speed", None)
        self.profile_speed = speed.summary() if speed is not None else {}


def _s(x: Any) -> Any:
    return None if x is None else str(x)
