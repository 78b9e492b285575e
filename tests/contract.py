"""Shared pieces of the contract tests, for every backend: the policies that must build
identical trees (DESIGN §4), and a Server that checks the KV invariants as it runs."""
from __future__ import annotations

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
    ("fasttts", []),
]
POLICIES = ["nonspec", "nonspec_cd", "spec", "ep_strict", "ep", "ep_cd", "full", "fasttts"]


class CheckedServer(Server):
    """The real Server, checking the KV invariants after every iteration."""

    def _check(self):
        errors = self.gen.kv_errors()
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
