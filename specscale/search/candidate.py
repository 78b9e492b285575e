"""Logical candidates: one path of the search tree (parent path + one new step)."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional


class Status(Enum):
    RUNNING = "running"  # generating its step (placed on a physical sequence)
    DONE = "done"  # its step has ended (delimiter, EOS or a cap)
    CANCELLED = "cancelled"


# Why a step ended.
END_DELIMITER = "delimiter"
END_EOS = "eos"
END_STEP_CAP = "step_cap"
END_PATH_CAP = "path_cap"


def step_end_reason(token: int, eos_ids, delimiter_ids, path_len: int, path_cap: int, history_len: int,
                    max_len: int, step_len: int, step_cap: int) -> Optional[str]:
    """Why a step ends after `token` (None: it goes on), in the one order every engine uses:
    EOS, then the path cap or the model window (terminal), then the delimiter, then the
    step cap. path_len: the path's tokens including this step's; history_len: the
    sequence's tokens (prompt + path) for the window check."""
    if token in eos_ids:
        return END_EOS
    if path_len >= path_cap or history_len >= max_len:
        return END_PATH_CAP
    if token in delimiter_ids:
        return END_DELIMITER
    if step_len >= step_cap:
        return END_STEP_CAP
    return None


@dataclass(eq=False)
class Candidate:
    """A logical candidate. Identity is the lineage key; physical placement is separate.

    `position` is the candidate's index within its round; it is None while the round's
    membership is unknown (a speculative candidate whose parent's round is unresolved).
    """

    cid: int
    key: int
    request_id: int
    round: int  # -1 for the root (the prompt)
    child_index: int
    parent: Optional["Candidate"]
    path_tokens_before: int  # path tokens (excluding the prompt) before this step
    status: Status = Status.RUNNING
    position: Optional[int] = None
    group: int = 0  # the selection group it belongs to: its DVTS subtree, else 0 (specscale/search/rules.py)
    step_tokens: list[int] = field(default_factory=list)
    end_reason: Optional[str] = None
    terminal: bool = False
    end_hash: int = 0  # hash of the whole history at the end of the step
    step_scores: Optional[tuple[float, ...]] = None
    score: Optional[float] = None
    verify_order: Optional[int] = None
    pruned: bool = False
    holds_kv: bool = False  # keeps its physical sequence alive for children to fork from
    children: dict[int, "Candidate"] = field(default_factory=dict)
    extending: bool = False  # FastTTS: a child 0 started before its parent's round resolved
    phys: Any = None  # the PhysicalSequence it runs on / finished on
    step_start: int = 0  # index in phys.tokens where this step starts
    start_time: float = 0.0
    end_time: Optional[float] = None
    answer: Any = None

    @property
    def path_tokens(self) -> int:
        return self.path_tokens_before + len(self.step_tokens)

    @property
    def live(self) -> bool:
        return self.status is not Status.CANCELLED

    def ancestors(self):
        node = self.parent
        while node is not None and node.round >= 0:
            yield node
            node = node.parent

    def path(self) -> list["Candidate"]:
        """Candidates from round 0 down to this one."""
        chain = [self, *self.ancestors()]
        chain.reverse()
        return chain
