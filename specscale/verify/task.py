"""A verification task: one PRM evaluation of one text, serving every identical member."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class VerifyTask:
    tid: int
    request_id: int
    candidates: list[Any]  # logical candidates with identical text (one with CD off)
    n_tokens: int  # PRM input tokens this task adds (uncached part of its path)
    enqueue_time: float
    enqueue_iteration: int = 0  # the queue's generation-iteration count when it was added
    deferrals: int = 0  # as policy.lv_deferral counts them (set when it leaves the queue)
    input_tokens: int = 0  # its whole scoring input: the PRM reads its path from the question on
    enqueue_decision: int = 0  # the queue's count of decisions that left tasks waiting, when added
    lookahead_for: list["VerifyTask"] = field(default_factory=list)  # parent tasks it covers

    @property
    def round(self) -> int:
        return self.candidates[0].round

    def in_groups(self, groups: set[tuple[int, int]]) -> bool:
        """One of its candidates is a child of a parent in ``groups`` ((request, parent cid))."""
        return any((self.request_id, c.parent.cid) in groups for c in self.candidates)

    @property
    def known(self) -> bool:
        """Its round's membership is known (not speculative)."""
        return self.candidates[0].position is not None
