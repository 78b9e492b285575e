"""Verification queue: when to run a PRM batch and what goes in it.

Modes (docs/design.md §3):
- barrier: a request's round is verified once all its members finished their step;
  all rounds ready at that moment go in one batch (FastTTS adds lookahead).
- immediate: every completed step is verified at the next engine iteration.
- lazy (the paper's Algorithm 3): flush when the pending verification volume reaches
  B_max, when a sibling group has entirely finished its step, when a task was deferred
  d_max times, when an optional (modelled) age cap is reached; the Server adds the fourth
  trigger: no generation work can run. Where the paper leaves a choice, a switch names
  it (docs/design.md §3): the volume counts each task's scoring input or only its new
  PRM tokens (``policy.lv_volume``); a completed sibling group flushes the tasks of the
  groups that have completed, or everything (``policy.lv_sibling_flush``). (Topping a
  group's batch up with other tasks "while it fits under B_max" would take everything:
  the token trigger is checked first, so at a sibling decision the whole queue is below
  B_max.) A deferral is a verification decision that passed the task over, or a
  generation iteration it waited through (``policy.lv_deferral``).
- adaptive (specscale/verify/adaptive.py): the sibling trigger and the age cap
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
        self.pending_tokens = 0  # new PRM tokens of the pending tasks
        self.pending_input_tokens = 0  # their whole scoring inputs
        self.enqueued_tokens = 0  # PRM tokens ever added (arrival rate of the adaptive rule)
        self._ready_rounds: set[tuple[int, int]] = set()
        # (request, parent cid) of the sibling groups that finished since the last flush:
        # non-empty = the sibling trigger is due
        self._ready_groups: set[tuple[int, int]] = set()
        self._count_decisions = policy.verification == "lazy" and policy.lv_deferral == "decisions"
        # Deferrals are derived, not counted per task: a task's deferrals are the decisions
        # (or generation iterations) since it was added, and the oldest pending task (first
        # in insertion order) has the most. No per-iteration loop over pending tasks.
        self.generation_iterations = 0
        self.decisions = 0  # verification decisions that left tasks waiting

    def __len__(self) -> int:
        return len(self.pending)

    # ------------------------------------------------------------------ updates
    def add(self, request_id: int, candidates: list[Any], n_tokens: int, now: float,
            input_tokens: Optional[int] = None) -> VerifyTask:
        """n_tokens: the PRM tokens the task computes; input_tokens: its whole scoring input
        (None: the same)."""
        task = VerifyTask(next(self._tid), request_id, list(candidates), n_tokens, now, self.generation_iterations,
                          input_tokens=n_tokens if input_tokens is None else input_tokens,
                          enqueue_decision=self.decisions)
        self.pending[task.tid] = task
        for c in candidates:
            self._by_cand[c.cid] = task
        self.pending_tokens += n_tokens
        self.pending_input_tokens += task.input_tokens
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
            self.pending_input_tokens -= task.input_tokens

    def on_generation_iteration(self) -> None:
        self.generation_iterations += 1

    def deferrals(self, task: VerifyTask) -> int:
        if self._count_decisions:
            return self.decisions - task.enqueue_decision
        return self.generation_iterations - task.enqueue_iteration

    @property
    def volume(self) -> int:
        """The pending verification volume B_max is compared with (``policy.lv_volume``)."""
        return self.pending_input_tokens if self.policy.lv_volume == "input" else self.pending_tokens

    def round_complete(self, request_id: int, round_index: int) -> None:
        self._ready_rounds.add((request_id, round_index))

    def sibling_group_complete(self, request_id: int, round_index: int, parent_cid: int) -> None:
        if self.policy.sibling_trigger:
            self._ready_groups.add((request_id, parent_cid))

    # ------------------------------------------------------------------ decisions
    def due(self, now: float) -> Optional[tuple[str, list[VerifyTask]]]:
        """The trigger and tasks of the PRM batch to run now, or None."""
        if not self.pending:
            self._ready_groups.clear()
            return None
        mode = self.policy.verification
        if mode == "immediate":
            return TRIGGER_IMMEDIATE, self.take_all()
        if mode == "barrier":
            return self._barrier()
        if mode == "lazy":
            due = self._lazy(now)
        else:
            trigger = self._adaptive_trigger(now)
            due = (trigger, self.take_all()) if trigger else None
        if self.pending:
            self.decisions += 1  # a decision that left these tasks waiting
        return due

    def _lazy(self, now: float) -> Optional[tuple[str, list[VerifyTask]]]:
        p = self.policy
        if self.volume >= p.b_max:
            return TRIGGER_TOKENS, self.take_all()
        if self._ready_groups:
            if p.lv_sibling_flush == "all":
                return TRIGGER_SIBLINGS, self.take_all()
            group = [t for t in self.pending.values() if t.in_groups(self._ready_groups)]
            self._ready_groups.clear()
            if group:
                self._remove(group)
                return TRIGGER_SIBLINGS, group
        oldest = next(iter(self.pending.values()))
        if self.deferrals(oldest) >= p.d_max:
            return TRIGGER_DEFERRALS, self.take_all()
        age = self._age_trigger(oldest, now)
        return (age, self.take_all()) if age else None

    def _adaptive_trigger(self, now: float) -> Optional[str]:
        if self._ready_groups:
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
        self._ready_groups.clear()
        return tasks

    def _remove(self, tasks: list[VerifyTask]) -> None:
        for t in tasks:
            t.deferrals = self.deferrals(t)
            del self.pending[t.tid]
            self.pending_tokens -= t.n_tokens
            self.pending_input_tokens -= t.input_tokens
            for c in t.candidates:
                self._by_cand.pop(c.cid, None)
