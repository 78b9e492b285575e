"""Physical sequences: one token history, one KV footprint, many logical members."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specscale.hashing import roll


@dataclass(eq=False, slots=True)
class PhysicalSequence:
    """A token history that the engine computes once.

    Without deduplication each running logical candidate has its own sequence (they
    still share prefix blocks through forks). With CD, every logical candidate with an
    identical history is a member of one sequence: one forward row, one draw per member.
    After the members' step ends the sequence is kept (`holders` > 0) so children can
    fork from its KV; it is freed when nobody runs on it or holds it.
    """

    sid: int
    request_id: int
    admit_order: int
    tokens: list[int]
    hist_hash: int
    num_cached: int = 0
    blocks: list[int] = field(default_factory=list)
    step_pos: int = 0  # tokens sampled so far in the current step
    n_steps: int = 0  # completed steps in the history
    members: list[Any] = field(default_factory=list)  # running logical candidates
    holders: int = 0  # finished candidates that keep this KV for their children
    prefix_only: bool = False  # the prompt root: cache all but the last prompt token, no draws
    preemptions: int = 0
    freed: bool = False
    # Prefix caching: chain hashes of the history's first full blocks (computed once per
    # block, kept across preemptions: the history never shrinks), how many leading
    # blocks of the table have been offered to the hash table, and how far KV of this
    # history had been computed before it was lost (the recomputation counter's bound).
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered: int = 0
    recompute_until: int = 0
    # numpy copy of `blocks` kept by the torch batch builder (batch_builder.TableMirror)
    table_mirror: Any = field(default=None, repr=False, compare=False)

    @property
    def target_cached(self) -> int:
        """Tokens that must be in the cache before this sequence is useful."""
        return len(self.tokens) - 1 if self.prefix_only else len(self.tokens)

    @property
    def runnable(self) -> bool:
        return not self.freed and (bool(self.members) or (self.prefix_only and self.num_cached < self.target_cached))

    @property
    def speculative(self) -> bool:
        """Every member is ahead of an unresolved selection."""
        return bool(self.members) and all(m.position is None for m in self.members)

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self.hist_hash = roll(self.hist_hash, token)
        self.step_pos += 1


def history_hash(tokens: list[int], seed: int = 0) -> int:
    """Rolling hash of a whole token history (identical history <=> same hash, w.h.p.)."""
    h = seed
    for t in tokens:
        h = roll(h, t)
    return h
