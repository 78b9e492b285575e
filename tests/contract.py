"""Shared pieces of the contract tests, for every backend: the policies that must build
identical trees (docs/design.md §4), and a Server that checks the KV invariants as it runs."""
from __future__ import annotations

import pandas as pd
import pytest

from specscale.search.candidate import Status
from specscale.server.server import Server

# Policies equivalent to nonspec: the perfect-score shortcut is switched off where on.
EQUIVALENT = [
    ("nonspec", []),
    ("nonspec_cd", []),
    ("spec", []),
    ("ep_strict", []),
    ("ep_cd", ["policy.pruning=strict"]),
    ("full", ["policy.pruning=strict"]),
    # without the sibling trigger the price rule (not the safeguard) times most flushes
    ("adaptive", ["policy.pruning=strict", "policy.sibling_trigger=false"]),
    ("fasttts", []),
]
POLICIES = ["nonspec", "nonspec_cd", "spec", "ep_strict", "ep", "ep_cd", "full", "adaptive", "fasttts"]
TREE_COLS = ["request_id", "round", "member_keys", "member_texts", "member_terminal", "selected_keys"]
ANSWER_COLS = ["request_id", "answer", "answer_best_single", "answer_majority", "logical_tokens"]


def frames(rec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's rounds and requests, in a canonical order."""
    rounds = pd.DataFrame(rec.rounds).sort_values(["request_id", "round"]).reset_index(drop=True)
    answers = pd.DataFrame(rec.requests).sort_values("request_id").reset_index(drop=True)
    return rounds, answers


def assert_same_tree(rec, ref, what: str, score_tol: float = 0.0) -> None:
    """Same members, texts, selections and answers; scores equal within score_tol."""
    rounds, answers = frames(rec)
    ref_rounds, ref_answers = frames(ref)
    pd.testing.assert_frame_equal(rounds[TREE_COLS], ref_rounds[TREE_COLS], obj=f"rounds of {what}")
    for got, want in zip(rounds["member_scores"], ref_rounds["member_scores"]):
        if score_tol:
            assert got == pytest.approx(want, abs=score_tol, rel=0), what
        else:
            assert got == want, what
    pd.testing.assert_frame_equal(answers[ANSWER_COLS], ref_answers[ANSWER_COLS], obj=f"answers of {what}")


class CheckedServer(Server):
    """The real Server, checking the generator's and the PRM's KV invariants after every
    iteration."""

    def _check(self):
        errors = self.gen.kv_errors() + self.prm_cache.errors()
        for req in self.active.values():
            for c in req.search.candidates:
                if c.status is Status.CANCELLED and (c.holds_kv or (c.phys is not None and c in c.phys.members)):
                    errors.append(f"cancelled candidate {c.cid} still holds KV")
        assert not errors, errors[:5]
        self.checks += 1

    def _generate(self):
        super()._generate()
        self._check()

    def _verify(self, trigger, tasks):
        super()._verify(trigger, tasks)
        self._check()


def checked(server: Server) -> CheckedServer:
    """Turn a built Server into a CheckedServer (same state, checks added)."""
    server.__class__ = CheckedServer
    server.checks = 0
    return server
