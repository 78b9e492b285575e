"""Per-request search controller: rounds, selection, early pruning, speculation.

Pure Python: it never touches tensors or blocks. It talks to the serving side through
`SearchOps` (place children on physical sequences, stop a candidate, release KV,
readiness signals for the verification queue). Every decision that shapes the search
tree depends only on lineage and scores, never on timing, except the perfect-score
shortcut, which docs/design.md §4.3 allows to differ and which is reported per round.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional, Protocol

from specscale.settings.search_policy import PolicyConfig, SearchConfig
from specscale.hashing import child_key
from specscale.search.answer import FinalAnswers, aggregate, final_answers, returned_path
from specscale.search.candidate import END_EOS, END_PATH_CAP, Candidate, Status
from specscale.search.round import CLOSED_ALL_SCORED, CLOSED_SHORTCUT, Round
from specscale.search.selection import select_top_k, shortcut_selection, strictly_below_threshold


class SearchOps(Protocol):
    def now(self) -> float: ...
    def start_children(self, parent: Candidate, children: list[Candidate]) -> None: ...
    def cancel(self, cand: Candidate) -> None: ...
    def release(self, cand: Candidate) -> None: ...
    def discard(self, cand: Candidate) -> None: ...  # will never be extended (pruned / not selected)
    def round_complete(self, request_id: int, round_index: int) -> None: ...
    def sibling_group_complete(self, request_id: int, round_index: int, parent_cid: int) -> None: ...
    def request_finished(self, search: "RequestSearch") -> None: ...


class RequestSearch:
    def __init__(
        self,
        request_id: int,
        root: Candidate,
        search: SearchConfig,
        policy: PolicyConfig,
        ops: SearchOps,
        ids: Iterator[int],
        answer_of: Callable[[Candidate], Any],
        equivalent: Callable[[Any, Any], bool],
    ) -> None:
        self.request_id = request_id
        self.root = root
        self.cfg = search
        self.policy = policy
        self.ops = ops
        self._ids = ids
        self._answer_of = answer_of
        self._equivalent = equivalent
        self._verify_counter = itertools.count()
        self.rounds: list[Round] = []
        self.last_resolved = -1
        self.finished: list[Candidate] = []
        self.candidates: list[Candidate] = []
        self.done = False
        self.final: Optional[FinalAnswers] = None
        self.final_paths: list[Candidate] = []
        self.returned: Optional[Candidate] = None  # the path whose answer is returned (its response)
        self.active_extensions = 0
        self.waiting_extensions: list[Candidate] = []
        self.round_records: list[dict] = []
        self.shortcut_rounds = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """The prompt is cached: open round 0 with the root's N children."""
        kids = [self._make_child(self.root, j) for j in range(self.cfg.beam)]
        self.ops.start_children(self.root, kids)
        self.ops.release(self.root)
        self._open_round(0, kids)

    def _make_child(self, parent: Candidate, j: int) -> Candidate:
        child = Candidate(
            cid=next(self._ids),
            key=child_key(parent.key, j),
            request_id=self.request_id,
            round=parent.round + 1,
            child_index=j,
            parent=parent,
            path_tokens_before=parent.path_tokens,
            start_time=self.ops.now(),
        )
        parent.children[j] = child
        self.candidates.append(child)
        return child

    def _spawn(self, parent: Candidate, indices) -> list[Candidate]:
        kids = [self._make_child(parent, j) for j in indices if j not in parent.children]
        if kids:
            self.ops.start_children(parent, kids)
        if len(parent.children) == self.cfg.expansion:
            self.ops.release(parent)  # every child has forked: the parent's KV is no longer needed
        return kids

    # ------------------------------------------------------------------ events
    def on_step_finished(self, c: Candidate) -> None:
        """Called once per member whose step just ended (status already DONE)."""
        c.terminal = c.end_reason in (END_EOS, END_PATH_CAP) or c.round == self.cfg.max_rounds - 1
        if c.extending:
            c.extending = False
            self.active_extensions -= 1
        if c.position is not None:
            self._count_finished(self.rounds[c.round], c)
        if c.terminal:
            self.ops.release(c)
        else:
            self._maybe_spawn(c)
        self._fill_extensions()

    def on_scored(self, c: Candidate, step_scores: tuple[float, ...]) -> None:
        c.step_scores = tuple(step_scores)
        c.score = aggregate(c.step_scores, self.cfg.score_agg)
        c.verify_order = next(self._verify_counter)
        if c.position is None or self.done:
            return  # speculative: EP applies once its round's membership is known
        rd = self.rounds[c.round]
        if not rd.resolved:
            self._on_round_score(rd, c)

    # ------------------------------------------------------------------ rounds
    def _count_finished(self, rd: Round, c: Candidate) -> None:
        rd.unfinished -= 1
        pid = c.parent.cid
        rd.group_unfinished[pid] -= 1
        if rd.group_unfinished[pid] == 0:
            self.ops.sibling_group_complete(self.request_id, rd.index, pid)
        if rd.unfinished == 0:
            self.ops.round_complete(self.request_id, rd.index)

    def _open_round(self, index: int, members: list[Candidate]) -> None:
        rd = Round.open(index, members)
        self.rounds.append(rd)
        for m in members:
            if m.extending:  # a FastTTS extension whose parent was selected is now a member
                m.extending = False
                self.active_extensions -= 1
        # Scores that arrived while the round was speculative, in verification order.
        for m in sorted((m for m in members if m.score is not None), key=lambda m: m.verify_order):
            self._on_round_score(rd, m)
            if rd.resolved:
                return
        if rd.unfinished == 0:
            self.ops.round_complete(self.request_id, index)
        for pid, left in rd.group_unfinished.items():  # groups that finished while speculative
            if left == 0:
                self.ops.sibling_group_complete(self.request_id, index, pid)
        for m in members:
            if m.status is Status.DONE and not m.terminal and not m.pruned:
                self._maybe_spawn(m)
        self._fill_extensions()
        if not members:
            self._finish()

    def _on_round_score(self, rd: Round, c: Candidate) -> None:
        rd.scored += 1
        k = self.cfg.keep
        if not c.terminal:
            rd.verified.append(c)
            if self.policy.pruning != "off":
                for m in strictly_below_threshold(rd.verified, k):
                    if not m.pruned:
                        self._prune(m)
                if self.policy.pruning == "shortcut":
                    chosen = shortcut_selection(rd.verified, k)
                    if chosen is not None:
                        self._resolve(rd, chosen, CLOSED_SHORTCUT)
                        return
        if rd.scored == len(rd.members) and rd.unfinished == 0:
            self._resolve(rd, select_top_k(rd.members, k), CLOSED_ALL_SCORED)

    def _prune(self, m: Candidate) -> None:
        """Strict early pruning: m can no longer be selected."""
        m.pruned = True
        self._cancel_descendants(m)
        self.ops.release(m)
        self.ops.discard(m)
        if m in self.waiting_extensions:
            self.waiting_extensions.remove(m)

    def _resolve(self, rd: Round, selected: list[Candidate], closed_by: str) -> None:
        rd.resolved = True
        rd.closed_by = closed_by
        rd.selected = selected
        rd.resolve_time = self.ops.now()
        self.last_resolved = rd.index
        if closed_by == CLOSED_SHORTCUT:
            self.shortcut_rounds += 1
        chosen = set(map(id, selected))
        if any(m.pruned for m in selected):  # the order-statistic argument forbids this
            raise AssertionError(f"request {self.request_id} round {rd.index}: a pruned member was selected")
        for m in rd.members:
            if id(m) in chosen:
                continue
            if m.score is None:  # only the shortcut closes a round with unscored members
                self._cancel_subtree(m)
            elif m.terminal:
                self.finished.append(m)
            else:
                self._cancel_descendants(m)
                self.ops.release(m)
                self.ops.discard(m)
        self.waiting_extensions = [c for c in self.waiting_extensions if c.round > rd.index]
        self._record_round(rd)
        if len(self.finished) >= self.cfg.beam or not selected or rd.index >= self.cfg.max_rounds - 1:
            self._finish()
            return
        members: list[Candidate] = []
        for p in sorted(selected, key=lambda m: m.position):
            self._spawn(p, range(self.cfg.expansion))
            members.extend(p.children[j] for j in range(self.cfg.expansion))
        self._open_round(rd.index + 1, members)

    def _record_round(self, rd: Round) -> None:
        self.round_records.append(
            {
                "request_id": self.request_id,
                "round": rd.index,
                "member_keys": [_signed(m.key) for m in rd.members],
                "member_texts": [list(m.step_tokens) for m in rd.members],
                "member_scores": [m.score for m in rd.members],
                "member_terminal": [m.terminal for m in rd.members],
                "member_status": [m.status.value for m in rd.members],
                "selected_keys": [_signed(m.key) for m in rd.selected],
                "closed_by": rd.closed_by,
                "resolve_time": rd.resolve_time,
                "logical_tokens": sum(len(m.step_tokens) for m in rd.members if m.end_time is not None),
            }
        )

    # ------------------------------------------------------------------ speculation
    def _maybe_spawn(self, c: Candidate) -> None:
        if self.done or c.pruned or not c.live or c.terminal or len(c.children) == self.cfg.expansion:
            return
        if c.position is not None and self.rounds[c.round].resolved:
            self._spawn(c, range(self.cfg.expansion))  # selected: its children are the next round
            return
        mode = self.policy.speculation
        if mode == "none" or c.round - self.last_resolved > self.policy.depth:
            return
        if mode == "naive":
            self._spawn(c, range(self.cfg.expansion))
        elif 0 not in c.children and c not in self.waiting_extensions:
            self.waiting_extensions.append(c)

    def _fill_extensions(self) -> None:
        """FastTTS: at most K finished candidates extend at once, best parent score first."""
        if self.policy.speculation != "extension" or self.done:
            return
        while self.active_extensions < self.cfg.keep and self.waiting_extensions:
            best = max(
                self.waiting_extensions,
                key=lambda c: (c.parent.score if c.parent.score is not None else 0.0, -c.cid),
            )
            self.waiting_extensions.remove(best)
            if not best.live or best.pruned or 0 in best.children or best.round - self.last_resolved > self.policy.depth:
                continue
            (child,) = self._spawn(best, [0])
            child.extending = True
            self.active_extensions += 1

    # ------------------------------------------------------------------ cancellation
    def _cancel_descendants(self, c: Candidate) -> None:
        for child in list(c.children.values()):
            if child.live:
                self._cancel_subtree(child)

    def _cancel_subtree(self, c: Candidate) -> None:
        self._cancel_descendants(c)
        if c.extending:
            c.extending = False
            self.active_extensions -= 1
        if c in self.waiting_extensions:
            self.waiting_extensions.remove(c)
        self.ops.cancel(c)
        c.status = Status.CANCELLED

    def _finish(self) -> None:
        """End of search: cancel whatever still runs, release all KV, pick the answer."""
        self.done = True
        self.waiting_extensions.clear()
        for c in self.candidates:
            if not c.live:
                continue
            if c.status is Status.RUNNING or (c.position is None and c.score is None):
                self._cancel_subtree(c)
            else:
                self.ops.cancel(c)  # drops pending verification and KV holds; keeps its status
        pool = self.finished
        if not pool:  # nothing finished: fall back to the best-scored path of the last round
            last = self.rounds[-1] if self.rounds else None
            scored = [m for m in (last.members if last else []) if m.score is not None]
            pool = sorted(scored, key=lambda m: (-m.score, m.position))[:1]
        self.final_paths = pool
        answers = [self._answer_of(c) for c in pool]
        for c, a in zip(pool, answers):
            c.answer = a
        scores = [c.score for c in pool]
        self.final = final_answers(answers, scores, self._equivalent)
        i = returned_path(answers, scores, self._equivalent)
        self.returned = pool[i] if i is not None else None
        self.ops.request_finished(self)


def _signed(key: int) -> int:
    """uint64 lineage key as int64 (two's complement), so parquet stores it losslessly."""
    return key - (1 << 64) if key >= (1 << 63) else key
