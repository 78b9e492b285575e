"""The searches as data (specscale/search/rules.py, docs/design.md §2.1): each search selects
what its reference semantics select, the degenerate cases equal beam search, the strict
policies build nonspec's tree on every search that allows them, refused combinations say
the fix, and beam cells keep their hashes."""
from __future__ import annotations

import functools
import hashlib
import itertools

import pandas as pd
import pytest

from cfg_helpers import compose_cfg, compose_spec
from contract import EQUIVALENT, TREE_COLS, assert_same_tree, checked, frames
from specscale.cell import build_server
from specscale.results.store import canonical_config, config_hash
from specscale.search.candidate import END_DELIMITER, END_EOS, Candidate, Status
from specscale.search.controller import RequestSearch
from specscale.search.rules import rebase_allocation
from specscale.settings.search_policy import ConfigError, PolicyConfig, SearchConfig, check_search_policy

KINDS = ["beam", "best_of_n", "dvts", "rebase"]


# ---------------------------------------------------------------- a constructed PRM
class PRM:
    """Scores and step ends fixed by lineage (the child indices from the root), from a small
    grid so ties (and 1.0) are frequent; `scripted` overrides single paths."""

    def __init__(self, seed: int, scripted: dict | None = None, terminal_at: dict | None = None):
        self.seed, self.scripted, self.terminal_at = seed, scripted or {}, terminal_at or {}

    def _u(self, path, salt) -> int:
        return int(hashlib.sha1(repr((self.seed, salt, path)).encode()).hexdigest(), 16)

    def score(self, path) -> float:
        return self.scripted.get(path, (0.1, 0.3, 0.5, 0.5, 0.7, 0.9, 1.0)[self._u(path, "s") % 7])

    def terminal(self, path) -> bool:
        if path in self.terminal_at:
            return self.terminal_at[path]
        return self._u(path, "t") % 4 == 0  # EOS in about one step of four


def lineage(c) -> tuple:
    return tuple(x.child_index for x in c.path())


class Ops:
    """SearchOps without an engine: records what the controller starts and cancels."""

    def __init__(self):
        self.started: list[Candidate] = []
        self.cancelled: set[int] = set()
        self.finished = False

    def now(self):
        return 0.0

    def start_children(self, parent, children):
        self.started.extend(children)

    def cancel(self, c):
        self.cancelled.add(c.cid)

    def release(self, c): ...
    def discard(self, c): ...
    def round_complete(self, request_id, round_index): ...
    def sibling_group_complete(self, request_id, round_index, parent_cid): ...

    def request_finished(self, search):
        self.finished = True


def make_search(kind, beam, expansion, max_rounds, policy="nonspec", **search):
    ops = Ops()
    root = Candidate(cid=0, key=12345, request_id=0, round=-1, child_index=0, parent=None, path_tokens_before=0,
                     status=Status.DONE, end_time=0.0)
    pol = {"nonspec": PolicyConfig(name="nonspec"),
           "ep": PolicyConfig(name="ep", speculation="naive", pruning="shortcut", verification="immediate")}[policy]
    cfg = SearchConfig(beam=beam, expansion=expansion, max_rounds=max_rounds, kind=kind, **search)
    s = RequestSearch(0, root, cfg, pol, ops, itertools.count(1), answer_of=lambda c: lineage(c)[0] % 2,
                      equivalent=lambda a, b: a == b)
    return s, ops


def finish_steps(s, ops, prm, which=None):
    """End the step of every running candidate (or of `which`), as one engine iteration."""
    batch = [c for c in ops.started if c.status is Status.RUNNING and c.live and (which is None or c in which)]
    for c in batch:
        c.status, c.end_time, c.step_tokens = Status.DONE, 0.0, [len(lineage(c))]
        c.end_reason = END_EOS if prm.terminal(lineage(c)) else END_DELIMITER
    for c in batch:
        if c.live and not s.done:
            s.on_step_finished(c)


def score(s, prm, cands):
    for c in cands:
        if c.live and not s.done and c.score is None:
            s.on_scored(c, (prm.score(lineage(c)),))


def drive(kind, beam, expansion, max_rounds, prm, **search):
    """Lockstep: every running step ends, then every finished step is scored, until done."""
    s, ops = make_search(kind, beam, expansion, max_rounds, **search)
    s.start()
    while not s.done:
        finish_steps(s, ops, prm)
        score(s, prm, [c for c in ops.started if c.status is Status.DONE])
    return s


# ---------------------------------------------------------------- reference semantics
def reference(kind, n, m, max_rounds, prm, temperature=0.2):
    """The searches as plain batch loops (search-and-learn's shape: generate a round, score it,
    select), written apart from the controller. Returns [(members, selected)] and the pool."""
    rounds, finished = [], []
    members = [(j,) for j in range(n)]
    for r in range(max_rounds):
        last = r == max_rounds - 1
        terminal = {p: last or prm.terminal(p) for p in members}
        finished += [p for p in members if terminal[p]]
        live = [p for p in members if not terminal[p]]
        pos = {p: i for i, p in enumerate(members)}
        best = functools.partial(sorted, key=lambda p: (-prm.score(p), pos[p]))
        if kind == "beam":
            selected = best(live)[: n // m]
            grow = [] if len(finished) >= n or last else [(p, m) for p in sorted(selected, key=pos.get)]
        elif kind == "best_of_n":
            selected = live
            grow = [] if last else [(p, 1) for p in live]
        elif kind == "dvts":
            selected, grow = [], []
            for g in sorted({p[0] // m for p in members}):
                top = best([p for p in live if p[0] // m == g])[:1]
                selected += top
                if top and sum(q[0] // m == g for q in finished) < m and not last:
                    grow.append((top[0], m))
        else:
            budget = n - len(finished)
            counts = rebase_allocation([prm.score(p) for p in live], budget, temperature) if budget > 0 else []
            grow = [] if last or budget <= 0 else [(p, k) for p, k in zip(live, counts) if k]
            selected = [p for p, _ in grow]
        rounds.append((members, selected))
        if not grow:
            break
        members = [p + (j,) for p, k in grow for j in range(k)]
    return rounds, finished


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind,beam,expansion", [
    ("beam", 8, 4), ("beam", 4, 2), ("best_of_n", 6, 2), ("dvts", 8, 2), ("dvts", 9, 3), ("rebase", 8, 4),
    ("rebase", 5, 5),
])
def test_each_search_selects_what_its_reference_selects(kind, beam, expansion, seed):
    prm = PRM(seed)
    s = drive(kind, beam, expansion, 7, prm)
    want_rounds, want_finished = reference(kind, beam, expansion, 7, prm)
    got = [([lineage(c) for c in rd.members], [lineage(c) for c in rd.selected]) for rd in s.rounds]
    assert got == want_rounds
    assert [lineage(c) for c in s.finished] == want_finished
    assert [r["round"] for r in s.round_records] == list(range(len(s.rounds)))


def test_rebase_allocation_by_hand():
    # T = 1: shares e^0 : e^-0.4 : e^-0.8 of 8 are 3.775, 2.530, 1.695 -> floors 3, 2, 1 and the two
    # largest remainders (.775, .695) get one more each
    assert rebase_allocation([0.9, 0.5, 0.1], 8, 1.0) == [4, 2, 2]
    assert rebase_allocation([0.9, 0.5, 0.1], 8, 0.1) == [8, 0, 0]  # T = 0.1: e^-4 of the top's weight
    assert rebase_allocation([0.5, 0.5, 0.5], 4, 0.1) == [2, 1, 1]  # equal remainders: lower position
    assert rebase_allocation([0.2, 0.8], 0, 0.1) == [0, 0]
    for scores in ([0.1, 0.3, 0.3, 0.9], [1.0] * 7, [0.0, 1.0]):
        for budget in range(1, 17):
            assert sum(rebase_allocation(scores, budget, 0.2)) == budget


def test_rebase_budget_is_n_minus_finished():
    # Round 0: member 1 ends at EOS; 3 non-terminal members share 4 - 1 = 3 children.
    prm = PRM(0, scripted={(0,): 0.9, (1,): 0.9, (2,): 0.1, (3,): 0.5},
              terminal_at={(0,): False, (1,): True, (2,): False, (3,): False})
    s = drive("rebase", 4, 2, 2, prm)
    first = s.round_records[0]
    assert len(s.rounds[1].members) == 3
    assert [lineage(c) for c in s.rounds[1].members] == [(0, 0), (0, 1), (0, 2)]  # T = 0.1 favours 0.9
    assert len(first["selected_keys"]) == 1 and len(s.finished) == 4  # round 1 (the last) ends all


def test_dvts_keeps_one_member_per_subtree():
    # Two subtrees of M = 2: {0, 1} and {2, 3}; each keeps its best non-terminal member.
    prm = PRM(0, scripted={(0,): 0.4, (1,): 0.6, (2,): 0.9, (3,): 0.2},
              terminal_at={(0,): False, (1,): False, (2,): False, (3,): False})
    s = drive("dvts", 4, 2, 2, prm)
    assert [lineage(c) for c in s.rounds[0].selected] == [(1,), (2,)]
    assert [lineage(c) for c in s.rounds[1].members] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {c.group for c in s.rounds[1].members[:2]} == {0} and {c.group for c in s.rounds[1].members[2:]} == {1}


def test_dvts_shortcut_closes_one_subtree_only():
    prm = PRM(0, scripted={(0,): 0.4, (1,): 1.0, (2,): 0.9, (3,): 0.2},
              terminal_at={(0,): False, (1,): False, (2,): False, (3,): False})
    s, ops = make_search("dvts", 4, 2, 3, policy="ep")
    s.start()
    r0 = list(ops.started)
    finish_steps(s, ops, prm, which=[r0[1]])  # only member 1 has ended its step
    score(s, prm, [r0[1]])  # a perfect score: subtree 0 is decided, member 0 is not waited for
    rd = s.rounds[0]
    assert not rd.resolved and rd.closed == {0: [r0[1]]} and r0[0].status is Status.CANCELLED
    assert r0[2].live and r0[3].live  # subtree 1 still runs
    finish_steps(s, ops, prm, which=r0[2:])
    score(s, prm, r0[2:])
    assert rd.resolved and rd.closed_by == "shortcut" and [lineage(c) for c in rd.selected] == [(1,), (2,)]
    assert [lineage(c) for c in s.rounds[1].members] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert s.shortcut_rounds == 1


def test_best_of_n_continues_paths_without_a_barrier():
    prm = PRM(0, terminal_at={(j,): False for j in range(4)})
    s, ops = make_search("best_of_n", 4, 1, 5)
    s.start()
    finish_steps(s, ops, prm)  # no score yet: every path already has its next step running
    assert not s.rounds[0].resolved
    assert all(len(c.children) == 1 and c.children[0].position is None for c in s.rounds[0].members)
    score(s, prm, s.rounds[0].members)
    assert [len(rd.members) for rd in s.rounds] == [4, 4]


# ---------------------------------------------------------------- on the sim
SIM = ["n_problems=3", "concurrency=3"]


@functools.lru_cache(maxsize=None)
def run(*overrides):
    server = checked(build_server(compose_cfg(*SIM, *overrides)))  # the KV invariants after every iteration
    rec = server.run()
    assert rec.leaked_blocks == 0 and not rec.leaked_sequences
    return rec


def allowed(kind: str, policy: str, extra: list[str]) -> bool:
    cfg = compose_cfg(f"policy={policy}", *extra)
    try:
        check_search_policy(SearchConfig(kind=kind), PolicyConfig.from_config(cfg["policy"]))
    except ConfigError:
        return False
    return True


# Beyond the named policies: nonspec's search with scores as they come (no barrier), the
# path where best_of_n's run-ahead paths are scored before their round is known.
UNBARRIERED = [("nonspec", ["policy.verification=immediate"]), ("nonspec_cd", ["policy.verification=lazy"])]


@pytest.mark.parametrize("kind", ["best_of_n", "dvts", "rebase"])
@pytest.mark.parametrize("setting", [["beam=8", "expansion=4", "seed=1"], ["beam=4", "expansion=2", "seed=2",
                                                                          "search.score_agg=min"]],
                         ids=lambda o: " ".join(o))
def test_strict_policies_build_nonspec_tree(kind, setting):
    ref = run(f"search={kind}", "policy=nonspec", *setting)
    rounds, _ = frames(ref)
    assert len(rounds) > 3 * 2 and rounds["selected_keys"].map(len).sum() > 0
    policies = [(p, e) for p, e in EQUIVALENT[1:] + UNBARRIERED if allowed(kind, p, e)]
    assert len(policies) == (len(EQUIVALENT) - 1 + 2 if kind == "dvts" else 3)
    for policy, extra in policies:
        assert_same_tree(run(f"search={kind}", f"policy={policy}", *extra, *setting), ref, f"{kind} {policy}")


def test_searches_differ_from_beam():
    """Guard against a vacuous family: the same cell under each search builds another tree."""
    trees = {k: frames(run(f"search={k}", "policy=nonspec", "beam=8", "expansion=4", "seed=1"))[0] for k in KINDS}
    for a, b in itertools.combinations(KINDS, 2):
        assert not trees[a][TREE_COLS].equals(trees[b][TREE_COLS]), (a, b)


@pytest.mark.parametrize("policy", ["ep", "full"])
def test_dvts_shortcut_closes_subtrees(policy):
    rec = run("search=dvts", f"policy={policy}", "beam=8", "expansion=2", "seed=6")
    rounds = pd.DataFrame(rec.rounds)
    assert (rounds["closed_by"] == "shortcut").any()
    assert (rounds["member_status"].map(lambda s: "cancelled" in s)).any()  # unscored members of closed subtrees
    # one selected member per subtree still going: never more than N / M
    assert rounds["selected_keys"].map(len).max() <= 8 // 2


@pytest.mark.parametrize("policy,extra", [("nonspec", []), ("full", ["policy.pruning=strict"]), ("ep", [])])
def test_dvts_with_one_subtree_is_beam_search(policy, extra):
    common = ["beam=4", "expansion=4", "seed=4", f"policy={policy}", *extra]
    beam, dvts = run("search=beam", *common), run("search=dvts", *common)
    assert_same_tree(dvts, beam, f"dvts N/M=1 under {policy}")
    assert pd.DataFrame(dvts.rounds)["closed_by"].tolist() == pd.DataFrame(beam.rounds)["closed_by"].tolist()


@pytest.mark.parametrize("policy", ["nonspec", "nonspec_cd"])
def test_best_of_n_with_one_path_is_one_sample(policy):
    common = ["beam=1", "expansion=1", "seed=5", f"policy={policy}"]
    assert_same_tree(run("search=best_of_n", *common), run("search=beam", *common), "best_of_n N=1")


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize("kind,policy,switch", [
    ("best_of_n", "spec", "speculation"), ("best_of_n", "ep_strict", "speculation"), ("best_of_n", "full", "speculation"),
    ("rebase", "fasttts", "speculation"), ("rebase", "ep", "speculation"),
])
def test_refused_combinations_name_both_settings_and_the_fix(kind, policy, switch):
    with pytest.raises(ConfigError) as err:
        build_server(compose_cfg(f"search={kind}", f"policy={policy}"))
    msg = str(err.value)
    assert "\n" not in msg and f"search.kind={kind}" in msg and f"policy.{switch}=" in msg
    assert "use policy=nonspec or policy=nonspec_cd" in msg


@pytest.mark.parametrize("kind", ["best_of_n", "rebase"])
def test_pruning_alone_is_refused_where_nothing_is_selected_away(kind):
    with pytest.raises(ConfigError, match=rf"search.kind={kind} cannot run policy.pruning=strict"):
        build_server(compose_cfg(f"search={kind}", "policy=nonspec", "policy.pruning=strict"))


def test_bad_search_settings():
    with pytest.raises(ConfigError, match=r"search.kind must be one of \('beam', 'best_of_n', 'dvts', 'rebase'\)"):
        build_server(compose_cfg("search.kind=greedy"))
    with pytest.raises(ConfigError, match="search.rebase_temperature must be a number > 0"):
        build_server(compose_cfg("search=rebase", "search.rebase_temperature=0"))


def test_search_group_composes_under_the_search_block():
    default = compose_cfg(small=False)["search"]
    assert default["kind"] == "beam" and "rebase_temperature" not in default
    dvts = compose_cfg("search=dvts", "search.max_rounds=3", small=False)["search"]
    assert dvts == {**default, "kind": "dvts", "max_rounds": 3}
    rebase = compose_cfg("search=rebase", small=False)["search"]
    assert rebase["kind"] == "rebase" and rebase["rebase_temperature"] == 0.2


def test_beam_cells_keep_their_hash():
    spec = compose_spec(small=False)
    canon = canonical_config(spec)["search"]
    assert "kind" not in canon and "rebase_temperature" not in canon
    assert config_hash(compose_spec("search=beam", small=False)) == config_hash(spec)
    assert config_hash(compose_spec("search=dvts", small=False)) != config_hash(spec)
    rebase = ["search=rebase", "policy=nonspec"]  # the default policy (full) speculates: refused there
    canon = canonical_config(compose_spec(*rebase, small=False))["search"]
    assert canon["kind"] == "rebase" and canon["rebase_temperature"] == 0.2
    assert "rebase_temperature" not in canonical_config(compose_spec("search=dvts", small=False))["search"]
    assert config_hash(compose_spec(*rebase, "search.rebase_temperature=0.3", small=False)) != \
        config_hash(compose_spec(*rebase, small=False))


# ---------------------------------------------------------------- on torch (synthetic tokens)
# As tests/engine/torch/test_synthetic_tokens.py: real forwards of the tiny pair, tokens and
# scores from the sim's workload, so the torch tree must equal the sim's.
WORKLOAD = ["step_len_median=6.0", "steps_median=4.0", "content_vocab=64"]
TINY = ["model=tiny", "dataset=fixture_math500", "n_problems=2", "progress=false", "wandb.mode=disabled",
        "search.max_rounds=5", "search.step_token_cap=24", "search.path_token_cap=96",
        "beam=4", "expansion=2", "concurrency=2", "seed=3"]
ON_SIM = ["engine=sim", *(f"engine.synthetic.{w}" for w in WORKLOAD)]
ON_TORCH = ["engine=torch", "engine.synthetic_tokens=true", "engine.dtype=float32", "engine.cpu_kv_blocks=512",
            *(f"engine.synthetic.{w}" for w in WORKLOAD)]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("kind,policy,extra", [("best_of_n", "nonspec", []), ("dvts", "full", ["policy.pruning=strict"]),
                                               ("rebase", "nonspec_cd", [])])
def test_torch_synthetic_tree_equals_sim(kind, policy, extra):
    cell = [*TINY, f"search={kind}", f"policy={policy}", *extra]
    ref = build_server(compose_cfg(*cell, *ON_SIM, small=False)).run()
    assert len(frames(ref)[0]) >= 2 * 2
    got = build_server(compose_cfg(*cell, *ON_TORCH, small=False)).run()
    assert_same_tree(got, ref, f"torch synthetic {kind} {policy}")


def test_best_of_n_takes_any_n_whatever_the_expansion():
    """Every best-of-N path has one child: expansion (default 4) need not divide N."""
    rec = build_server(compose_cfg("search=best_of_n", "policy=nonspec", "beam=6", "expansion=4")).run()
    rounds = pd.DataFrame(rec.rounds)
    assert len(rounds) and (rounds[rounds["round"] == 0]["member_keys"].map(len) == 6).all()
    with pytest.raises(ConfigError, match="must be a positive multiple of expansion"):
        build_server(compose_cfg("search=dvts", "beam=6", "expansion=4"))
