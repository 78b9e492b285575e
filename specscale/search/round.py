"""State of one selection round of one request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from specscale.search.candidate import Candidate

CLOSED_ALL_SCORED = "all_scored"
CLOSED_SHORTCUT = "shortcut"


@dataclass(eq=False)
class Round:
    """Members are ordered by position, which is fixed by lineage (parent's position,
    then child index), never by timing."""

    index: int
    members: list[Candidate]
    unfinished: int = 0  # members still generating their step
    scored: int = 0  # members whose score has been delivered
    group_unfinished: dict[int, int] = field(default_factory=dict)  # parent cid -> children still generating
    verified: list[Candidate] = field(default_factory=list)  # verified non-terminal members, in verify order
    resolved: bool = False
    closed_by: Optional[str] = None
    selected: list[Candidate] = field(default_factory=list)
    resolve_time: Optional[float] = None

    @classmethod
    def open(cls, index: int, members: list[Candidate]) -> "Round":
        rd = cls(index=index, members=members)
        for pos, m in enumerate(members):
            m.position = pos
            if m.end_time is None:
                rd.unfinished += 1
                pid = m.parent.cid
                rd.group_unfinished[pid] = rd.group_unfinished.get(pid, 0) + 1
        return rd
