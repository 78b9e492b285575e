"""Per-request search controller: rounds, selection, early pruning, speculation.

Pure Python: it never touches tensors or blocks. It talks to the serving side through
`SearchOps` (place children on physical sequences, stop a candidate, release KV,
readiness signals for the verification queue). Every decision that shapes the search
tree depends only on lineage and scores, never on timing, except the perfect-score
shortcut, which docs/design.md §4.3 allows to differ and which is reported per round.

One controller runs every search (`search.kind`): what is search-specific (selection
groups, who is kept and with how many children, when the search ends) is a rule from
rules.py; the rounds, pruning, speculation and cancellation machinery here is shared.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional, Protocol

from specscale.settings.search_policy import PolicyConfig, SearchConfig, check_search_policy
from specscale.hashing import child_key
from specscale.search.answer import FinalAnswers, aggregate, final_answers, returned_path
from specscale.search.candidate import END_EOS, END_PATH_CAP, Candidate, Status
from specscale.search.round import CLOSED_ALL_SCORED, CLOSED_SHORTCUT, Round
from specscale.search.rules import rule_for


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
        check_search_policy(search, policy)  # CellSpec checked it; a hand-built Server may not have
        self.request_id = request_id
        self.root = root
        self.cfg = search
        self.rule = rule_for(search)
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
        self.child_counts: dict[int, int] = {}  # cid -> children its round's decision gave it

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
            group=self.rule.group_of_child(parent, j),
            path_tokens_before=parent.path_tokens,
            start_time=self.ops.now(),
        )
        parent.children[j] = child
        self.candidates.append(child)
        return child

    def _spawn(self, parent: Candidate, indices, total: int) -> list[Candidate]:
        """Start parent's children `indices`; total: how many children it gets in all."""
        kids = [self._make_child(parent, j) for j in indices if j not in parent.children]
        if kids:
            self.ops.start_children(parent, kids)
        if len(parent.children) == total:
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
        self._drop_parent_prefix(c.parent)
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
        if c.group in rd.closed:
            pass  # its group's selection is made (shortcut); its fate is settled at resolution
        elif not c.terminal:
            rd.verified.append(c)
            if self.policy.pruning != "off":
                for m in self.rule.unselectable(rd.verified, c):
                    if not m.pruned:
                        self._prune(m)
                if self.policy.pruning == "shortcut":
                    chosen = self.rule.shortcut(rd.verified, c)
                    if chosen is not None:
                        self._close_group(rd, c.group, chosen)
                        if rd.resolved:
                            return
        if rd.scored + rd.skipped == len(rd.members) and rd.unfinished == 0:
            self._resolve(rd, CLOSED_SHORTCUT if rd.closed else CLOSED_ALL_SCORED)

    def _close_group(self, rd: Round, group: int, chosen: list[Candidate]) -> None:
        """The shortcut decided a group's selection: stop waiting for the rest of the group.
        With one group (beam search) that closes the round; in DVTS the other subtrees go on."""
        rd.closed[group] = chosen
        if len(rd.closed) == len({m.group for m in rd.members}):
            self._resolve(rd, CLOSED_SHORTCUT)  # every group decided: cancels what is left
            return
        keep = set(map(id, chosen))
        for m in rd.members:
            if m.group != group or id(m) in keep or not m.live:
                continue
            if m.score is None:  # never scored now: the round no longer waits for it
                rd.skipped += 1
                if m.end_time is None:
                    self._count_finished(rd, m)
                self._cancel_subtree(m)
            elif not m.terminal and not m.pruned:
                self._prune(m)  # can no longer be selected: as strict pruning, stop what it started

    def _prune(self, m: Candidate) -> None:
        """Strict early pruning: m can no longer be selected."""
        m.pruned = True
        self._cancel_descendants(m)
        self.ops.release(m)
        self.ops.discard(m)
        if m in self.waiting_extensions:
            self.waiting_extensions.remove(m)

    def _resolve(self, rd: Round, closed_by: str) -> None:
        # Terminal scored members join the finished pool (in position order) before the
        # rule decides: the search's budget counts them (beam: N paths; rebase: N - finished).
        self.finished.extend(m for m in rd.members if m.live and m.terminal and m.score is not None)
        decision = self.rule.decide(rd.index, rd.members, rd.closed, self.finished)
        selected = decision.selected
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
            if id(m) in chosen or not m.live or (m.terminal and m.score is not None):
                continue  # selected, cancelled by a subtree's shortcut, or finished (above)
            if m.score is None:  # only the shortcut closes a round with unscored members
                self._cancel_subtree(m)
            else:
                self._drop(m)
        self.waiting_extensions = [c for c in self.waiting_extensions if c.round > rd.index]
        self._record_round(rd)
        if not decision.children:
            self._finish()
            return
        expanded = {id(p) for p, _ in decision.children}
        for m in selected:
            if id(m) not in expanded:
                self._drop(m)  # DVTS: selected in a subtree that has just ended
        members: list[Candidate] = []
        for p, n in decision.children:
            self.child_counts[p.cid] = n
            self._spawn(p, range(n), n)
            members.extend(p.children[j] for j in range(n))
        self._open_round(rd.index + 1, members)

    def _drop(self, m: Candidate) -> None:
        """m was scored but will never be extended: cancel what it started, free its KV."""
        self._cancel_descendants(m)
        self.ops.release(m)
        self.ops.discard(m)

    def _drop_parent_prefix(self, parent: Optional[Candidate]) -> None:
        """A parent with fewer than M children (best_of_n, rebase) whose children are all
        scored needs no PRM prefix any more; the PRM cache keeps one until a parent has M
        children (engine/prm_cache.py), so say it here. Beam and DVTS parents have M."""
        if parent is None or parent.round < 0 or len(parent.children) >= self.cfg.expansion:
            return
        if len(parent.children) == self._child_total(parent) and all(
                ch.score is not None or not ch.live for ch in parent.children.values()):
            self.ops.discard(parent)

    def _child_total(self, c: Candidate) -> int:
        """How many children c gets: its round's decision, else what a step end starts
        (best_of_n), else M (speculation starts all M before the decision)."""
        return self.child_counts.get(c.cid) or self.rule.step_end_children or self.cfg.expansion

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
        if self.done or c.pruned or not c.live or c.terminal or len(c.children) == self._child_total(c):
            return
        if self.rule.step_end_children:  # best_of_n: the path goes on whatever its score
            n = self.rule.step_end_children
            self._spawn(c, range(n), n)
            return
        if c.position is not None and self.rounds[c.round].resolved:
            n = self.child_counts.get(c.cid, 0)  # selected: its children are the next round
            if n:
                self._spawn(c, range(n), n)
            return
        mode = self.policy.speculation
        if mode == "none" or c.round - self.last_resolved > self.policy.depth:
            return
        if mode == "naive":
            self._spawn(c, range(self.cfg.expansion), self.cfg.expansion)
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
            (child,) = self._spawn(best, [0], self.cfg.expansion)
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
