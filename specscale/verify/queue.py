"""Verification queue: when to run a PRM batch and what goes in it.

Modes (docs/design.md §3):
- barrier: a request's round is verified once all its members finished their step;
  all rounds ready at that moment go in one batch (FastTTS adds lookahead).
- immediate: every completed step is verified at the next engine iteration.
- lazy (review Algorithm 3): flush when pending PRM tokens >= B_max, when a sibling
  group has entirely finished its step, when a task was deferred d_max times, when an
  optional (modelled) age cap is reached; the Server adds the fourth trigger: no
  generation work can run.
- adaptive (issue 16, specscale/verify/adaptive.py): the sibling trigger and the age cap
  stay as safeguards; B_max and d_max give way to ``decide``, the price rule the Server
  supplies (flush when unresolved decisions cost more than waiting saves).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

from specscale.settings.search_policy import PolicyConfig
from specscale.verify.task import VerifyTask

TRIGGER_IMMEDIATE = "immediate"
TRIGGER_BARRIER = "barrier"
TRIGGER_TOKENS = "tokens"
TRIGGER_SIBLINGS = "siblings"
TRIGGER_DEFERRALS = "deferrals"
TRIGGER_AGE = "age"
TRIGGER_IDLE = "idle"
TRIGGER_MEMORY = "memory"
TRIGGER_ADAPTIVE = "adaptive"


class VerifyQueue:
    def __init__(self, policy: PolicyConfig, decide: Optional[Callable[["VerifyQueue"], bool]] = None) -> None:
        if policy.verification == "adaptive" and decide is None:
            raise ValueError("policy.verification=adaptive needs its flush rule (decide); the Server supplies it")
        self.policy = policy
        self.decide = decide  # adaptive mode: flush the pending tasks now?
        self.pending: dict[int, VerifyTask] = {}  # insertion order = enqueue order
        self._by_cand: dict[int, VerifyTask] = {}
        self._tid = itertools.count()
        self.pending_tokens = 0
        self.enqueued_tokens = 0  # PRM tokens ever added (arrival rate of the adaptive rule)
        self._ready_rounds: set[tuple[int, int]] = set()
        self._sibling_ready = False
        # Deferrals are derived, not counted per task: a task's deferrals are the
        # generation iterations since it was added, and the oldest pending task (first in
        # insertion order) has the most. No per-iteration loop over pending tasks.
        self.generation_iterations = 0

    def __len__(self) -> int:
        return len(self.pending)

    # ------------------------------------------------------------------ updates
    def add(self, request_id: int, candidates: list[Any], n_tokens: int, now: float) -> VerifyTask:
        task = VerifyTask(next(self._tid), request_id, list(candidates), n_tokens, now, self.generation_iterations)
        self.pending[task.tid] = task
        for c in candidates:
            self._by_cand[c.cid] = task
        self.pending_tokens += n_tokens
        self.enqueued_tokens += n_tokens
        return task

    def task_of(self, cand: Any) -> Optional[VerifyTask]:
        return self._by_cand.get(cand.cid)

    def drop(self, cand: Any) -> None:
        """A cancelled candidate no longer needs its score."""
        task = self._by_cand.pop(cand.cid, None)
        if task is None:
            return
        task.candidates.remove(cand)
        if not task.candidates:
            del self.pending[task.tid]
            self.pending_tokens -= task.n_tokens

    def on_generation_iteration(self) -> None:
        self.generation_iterations += 1

    def deferrals(self, task: VerifyTask) -> int:
        return self.generation_iterations - task.enqueue_iteration

    def round_complete(self, request_id: int, round_index: int) -> None:
        self._ready_rounds.add((request_id, round_index))

    def sibling_group_complete(self, request_id: int, round_index: int) -> None:
        if self.policy.sibling_trigger:
            self._sibling_ready = True

    # ------------------------------------------------------------------ decisions
    def due(self, now: float) -> Optional[tuple[str, list[VerifyTask]]]:
        """The trigger and tasks of the PRM batch to run now, or None."""
        if not self.pending:
            self._sibling_ready = False
            return None
        mode = self.policy.verification
        if mode == "immediate":
            return TRIGGER_IMMEDIATE, self.take_all()
        if mode == "barrier":
            return self._barrier()
        trigger = self._lazy_trigger(now) if mode == "lazy" else self._adaptive_trigger(now)
        return (trigger, self.take_all()) if trigger else None

    def _lazy_trigger(self, now: float) -> Optional[str]:
        p = self.policy
        if self.pending_tokens >= p.b_max:
            return TRIGGER_TOKENS
        if self._sibling_ready:
            return TRIGGER_SIBLINGS
        oldest = next(iter(self.pending.values()))
        if self.deferrals(oldest) >= p.d_max:
            return TRIGGER_DEFERRALS
        return self._age_trigger(oldest, now)

    def _adaptive_trigger(self, now: float) -> Optional[str]:
        if self._sibling_ready:
            return TRIGGER_SIBLINGS
        age = self._age_trigger(next(iter(self.pending.values())), now)
        if age is not None:
            return age
        return TRIGGER_ADAPTIVE if self.decide(self) else None

    def _age_trigger(self, oldest: VerifyTask, now: float) -> Optional[str]:
        cap = self.policy.age_cap_s
        return TRIGGER_AGE if cap is not None and now - oldest.enqueue_time >= cap else None

    def _barrier(self) -> Optional[tuple[str, list[VerifyTask]]]:
        ready = self._ready_rounds
        if not ready:
            return None
        chosen = [t for t in self.pending.values() if t.known and (t.request_id, t.round) in ready]
        self._ready_rounds = set()
        if not chosen:
            return None
        if self.policy.lookahead:
            chosen = self._with_lookahead(chosen)
        self._remove(chosen)
        return TRIGGER_BARRIER, chosen

    def _with_lookahead(self, chosen: list[VerifyTask]) -> list[VerifyTask]:
        """FastTTS lookahead: a finished child 0 is scored in the same pass as its parent."""
        picked = {t.tid for t in chosen}
        extra: list[VerifyTask] = []
        for task in chosen:
            for c in task.candidates:
                child = c.children.get(0)
                ct = self._by_cand.get(child.cid) if child is not None else None
                if ct is not None and ct.tid not in picked:
                    ct.lookahead_for.append(task)
                    picked.add(ct.tid)
                    extra.append(ct)
        return chosen + extra

    def take_all(self) -> list[VerifyTask]:
        tasks = list(self.pending.values())
        self._remove(tasks)
        self._sibling_ready = False
        return tasks

    def _remove(self, tasks: list[VerifyTask]) -> None:
        for t in tasks:
            t.deferrals = self.deferrals(t)
            del self.pending[t.tid]
            self.pending_tokens -= t.n_tokens
            for c in t.candidates:
                self._by_cand.pop(c.cid, None)
