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
    # group -> the perfect-score shortcut's selection, for groups it decided before the round
    # resolved (DVTS subtrees; beam search's one group resolves the round at once)
    closed: dict[int, list[Candidate]] = field(default_factory=dict)
    skipped: int = 0  # members of closed groups cancelled unscored: the round no longer waits for them
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
