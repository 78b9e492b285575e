"""Prefix caching of the generator's KV blocks: preempted and forked sequences re-attach
the cached full blocks of their history, and the policies' trees do not change."""
from __future__ import annotations

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import EQUIVALENT, assert_same_tree, checked
from specscale.cell import build_server
from specscale.engine.backend import BackendBase, GenBatch
from specscale.engine.block_manager import BlockManager
from specscale.engine.generation import GenerationEngine
from specscale.engine.scheduler import EngineLimits
from specscale.engine.sampler import SamplingParams
from specscale.search.candidate import Candidate, Status

BS = 4


class FlatBackend(BackendBase):
    """Uniform logits, no EOS, no delimiter: steps run until the step cap; every batch is kept."""

    vocab_size = 64
    eos_ids: frozenset[int] = frozenset()
    delimiter_ids: frozenset[int] = frozenset()

    def __init__(self):
        self.batches: list[GenBatch] = []

    def forward(self, batch: GenBatch):
        self.batches.append(batch)
        n = sum(r.wants_logits for r in batch.rows)
        return torch.zeros(n, self.vocab_size, dtype=torch.float64), 0.0


def engine(prefix_caching: bool = True, num_blocks: int = 64) -> GenerationEngine:
    return GenerationEngine(
        FlatBackend(), BlockManager(num_blocks, BS, prefix_caching=prefix_caching), SamplingParams(1.0, 1.0),
        EngineLimits(block_size=BS), step_token_cap=100, path_token_cap=1000, dedup=False,
    )


def start(gen: GenerationEngine, prompt: list[int], n_children: int) -> list[Candidate]:
    """Prefill the prompt, fork n children from it and release the root (as the search does)."""
    seq = gen.add_prompt(0, 0, prompt)
    root = Candidate(cid=0, key=1, request_id=0, round=-1, child_index=0, parent=None, path_tokens_before=0,
                     status=Status.DONE, holds_kv=True, phys=seq)
    seq.holders = 1
    res = gen.step()
    assert res.prefixes_done == [seq]
    kids = [Candidate(cid=1 + j, key=100 + j, request_id=0, round=0, child_index=j, parent=root,
                      path_tokens_before=0) for j in range(n_children)]
    gen.start_children(root, kids, 0.0)
    gen.remove_member(root)
    return kids


def rows_of(gen: GenerationEngine) -> dict[int, tuple[int, int]]:
    """sid -> (start, n_new) of the last iteration's rows."""
    return {r.seq.sid: (r.start, r.n_new) for r in gen.backend.batches[-1].rows}


def test_preempted_forks_reattach_their_shared_prompt_blocks():
    gen = engine()
    kids = start(gen, list(range(1, 15)), 2)  # 14 prompt tokens: 13 cached = 3 full blocks + 1 token
    a, b = kids[0].phys, kids[1].phys
    prompt_blocks = a.blocks[:3]
    assert b.blocks[:3] == prompt_blocks
    for _ in range(3):  # each child computes tokens 13, 14, 15: its private block 3 fills up
        gen.step()
        assert not gen.kv_errors()
    assert a.num_cached == b.num_cached == 16 and len(a.tokens) == 17
    own = a.blocks[3], b.blocks[3]
    assert own[0] != own[1] and all(gen.blocks.hash_of(x) is not None for x in a.blocks + b.blocks)
    gen.scheduler.preempt(a)
    gen.scheduler.preempt(b)
    assert all(gen.blocks.refcount[x] == 0 for x in prompt_blocks)  # free, but still findable
    assert gen.blocks.num_free == gen.blocks.num_blocks and not gen.kv_errors()

    gen.step()
    # Both re-attach the same prompt blocks (shared again) and their own full block; only
    # the last token is computed (its logits are needed).
    assert a.blocks[:4] == [*prompt_blocks, own[0]] and b.blocks[:4] == [*prompt_blocks, own[1]]
    assert all(gen.blocks.refcount[x] == 2 for x in prompt_blocks)
    assert gen.blocks.refcount[own[0]] == gen.blocks.refcount[own[1]] == 1
    assert rows_of(gen) == {a.sid: (16, 1), b.sid: (16, 1)}
    assert gen.prefix_hit_tokens == 32 and gen.prefix_hit_blocks == 8
    assert gen.recomputed_prefill_tokens == 0  # the last token was never computed before
    assert gen.total_preemptions == 2 and not gen.kv_errors()


def test_without_prefix_caching_a_preempted_sequence_recomputes_everything():
    gen = engine(prefix_caching=False)
    kids = start(gen, list(range(1, 15)), 2)
    for _ in range(3):
        gen.step()
    a, b = kids[0].phys, kids[1].phys
    gen.scheduler.preempt(a)
    gen.scheduler.preempt(b)
    gen.step()
    assert rows_of(gen) == {a.sid: (0, 17), b.sid: (0, 17)}
    assert len(set(a.blocks) & set(b.blocks)) == 0  # private copies: the sharing is lost
    assert gen.prefix_hit_tokens == 0 and gen.recomputed_prefill_tokens == 32
    assert gen.blocks.num_cached == 0 and not gen.kv_errors()


def test_reattach_stops_at_an_evicted_block_and_counts_recomputation():
    gen = engine(num_blocks=12)
    kids = start(gen, list(range(1, 15)), 1)
    for _ in range(3):
        gen.step()
    a = kids[0].phys
    blocks = list(a.blocks)  # 4 full, hashed blocks
    hashes = list(a.block_hashes)
    gen.scheduler.preempt(a)
    bm = gen.blocks
    # Evict block 1 of the history only: hold block 0, allocate until block 1 is reused.
    held = bm.reattach(hashes[:1])
    taken: list[int] = []
    while blocks[1] not in taken:
        taken.append(bm._allocate())
    assert bm.lookup(hashes[1]) is None and bm.lookup(hashes[2]) == blocks[2]
    bm.free(taken)
    bm.free(held)
    gen.step()
    # Only block 0 is re-attached: the lookup stops at the first miss although blocks 2
    # and 3 were still cached (then, being the least recently freed, they were reused).
    assert a.blocks[0] == blocks[0] and rows_of(gen) == {a.sid: (4, 13)}
    assert gen.prefix_hit_tokens == 4 and gen.recomputed_prefill_tokens == 12 and not gen.kv_errors()


def test_a_cached_prompt_still_computes_its_last_block():
    """A new prompt whose every block is cached re-attaches all but the block holding its
    last cached token, so its prefill runs and reports the prompt ready."""
    gen = engine()
    prompt = list(range(1, 18))  # 17 tokens: the root caches 16 = 4 full blocks
    kids = start(gen, prompt, 1)
    gen.remove_member(kids[0])  # cancelled: everything is free (and cached)
    assert gen.live_sequences() == 0 and gen.blocks.num_used == 0
    seq = gen.add_prompt(1, 1, prompt)
    seq.holders = 1  # its root candidate
    res = gen.step()
    assert rows_of(gen) == {seq.sid: (12, 4)} and res.prefixes_done == [seq]
    assert gen.prefix_hit_tokens == 12 and not gen.kv_errors()


def test_partial_blocks_are_never_hashed():
    gen = engine()
    kids = start(gen, list(range(1, 15)), 2)
    a = kids[0].phys
    gen.step()  # 14 cached: 3 full blocks + 2 tokens
    assert [gen.blocks.hash_of(x) is not None for x in a.blocks] == [True, True, True, False]
    assert a.num_registered == 3 and not gen.kv_errors()


# ---------------------------------------------------------------------------- end to end
SMALL_POOL = ["beam=8", "seed=13", "concurrency=4", "engine.kv_blocks=40"]


def checked_run(*overrides):
    s = checked(build_server(compose_cfg(*overrides)))
    rec = s.run()
    assert s.checks > 50  # kv_errors() (hash table included) was empty after every iteration
    assert rec.leaked_blocks == 0 and rec.leaked_sequences == 0
    assert s.blocks.num_free == s.blocks.num_blocks
    return s, rec


@pytest.mark.parametrize("policy,extra", EQUIVALENT, ids=[p for p, _ in EQUIVALENT])
def test_small_pool_same_tree_with_and_without_prefix_caching(policy, extra):
    on, rec_on = checked_run(f"policy={policy}", *extra, *SMALL_POOL)
    off, rec_off = checked_run(f"policy={policy}", *extra, *SMALL_POOL, "engine.prefix_caching=false")
    assert rec_on.preemptions > 0 and rec_off.preemptions > 0
    assert on.gen.prefix_hit_tokens > 0 and off.gen.prefix_hit_tokens == 0
    assert rec_on.prefix_hit_tokens == on.gen.prefix_hit_tokens  # what the recorder reads
    assert on.gen.recomputed_prefill_tokens < off.gen.recomputed_prefill_tokens
    assert rec_on.makespan_s < rec_off.makespan_s  # less prefill: a shorter modelled run
    assert_same_tree(rec_on, rec_off, f"{policy}: prefix caching on vs off")


def test_prefix_caching_keeps_the_unconstrained_tree():
    ref = build_server(compose_cfg("policy=spec", "beam=8", "seed=13", "concurrency=4",
                                   "engine.prefix_caching=false")).run()
    _, rec = checked_run("policy=spec", *SMALL_POOL)
    assert_same_tree(rec, ref, "spec: small pool with prefix caching vs unconstrained without")


# ---------------------------------------------------------------------------- torch, float64
TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64", "progress=false",
    "n_problems=1", "search.temperature=1.0", "search.max_rounds=5", "search.step_token_cap=12",
    "search.path_token_cap=60", "wandb.mode=disabled", "beam=4", "expansion=2", "concurrency=1", "seed=6",
]


def _record_logits(server) -> dict:
    """Wrap the generator's forward: history (request, hash, length) -> the logits drawn from."""
    seen: dict = {}
    forward = server.gen.backend.forward

    def recording(batch):
        logits, seconds = forward(batch)
        want = [r.seq for r in batch.rows if r.wants_logits]
        for seq, row in zip(want, logits):
            seen[seq.request_id, seq.hist_hash, len(seq.tokens)] = row.clone()
        return logits, seconds

    server.gen.backend.forward = recording
    return seen


@pytest.mark.parametrize("policy,extra", [("spec", []), ("full", ["policy.pruning=strict"])], ids=["spec", "full"])
def test_torch_small_pool_reuses_cached_kv_without_changing_the_tree(policy, extra):
    """The re-attached blocks' KV really is read by later forwards (the paged cache keeps a
    freed block's data until it is reallocated): every history's logits, and the tree,
    must equal those computed without prefix caching, within float64 noise."""
    from contract import CheckedServer

    runs = {}
    for pc in ("true", "false"):
        s = build_server(compose_cfg(*TORCH, f"policy={policy}", *extra, "engine.kv_blocks=33",
                                     f"engine.prefix_caching={pc}", small=False))
        s.__class__ = CheckedServer
        s.checks = 0
        logits = _record_logits(s)
        rec = s.run()
        assert rec.preemptions > 0 and rec.leaked_blocks == 0 and s.checks > 10
        runs[pc] = (s, rec, logits)
    (on, rec_on, lg_on), (off, rec_off, lg_off) = runs["true"], runs["false"]
    assert on.gen.prefix_hit_tokens > 0 and off.gen.prefix_hit_tokens == 0
    assert on.gen.recomputed_prefill_tokens < off.gen.recomputed_prefill_tokens
    common = lg_on.keys() & lg_off.keys()
    assert len(common) > 0.9 * len(lg_off)
    worst = max((lg_on[k] - lg_off[k]).abs().max().item() / lg_off[k].abs().max().item() for k in common)
    assert worst < 1e-10, worst
    assert_same_tree(rec_on, rec_off, f"{policy} torch: prefix caching on vs off", score_tol=1e-9)
