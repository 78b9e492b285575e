"""engine=vllm on CPU with the tiny_vllm pair: PRM rewards equal ours, greedy trees equal
engine=torch's, seeded policies build identical trees, KV back to baseline, preemption.

One pair of vLLM engines serves the whole module (start-up ~15-20 s): every cell here
uses the same engine settings, including a generator KV pool small enough (22 blocks of
32 tokens, one the null block; a prompt alone takes 15) that requests preempt each other.
"""
from __future__ import annotations

import functools
import random

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import EQUIVALENT, CheckedServer, assert_same_tree, frames

from specscale.cell import build_server, run_cell
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_rows import PRMRow
from specscale.testbed.tiny_models import ensure_tiny_models
from specscale.settings import CellSpec

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL_POOL = 22
TINY = [
    "model=tiny_vllm", "dataset=fixture_math500", "progress=false", "wandb.mode=disabled", "n_problems=3",
    "search.max_rounds=4", "search.step_token_cap=12", "search.path_token_cap=48", "beam=4", "expansion=2",
    "concurrency=3",
]
VLLM = ["engine=vllm", "engine.max_model_len=512", f"engine.kv_blocks={SMALL_POOL}"]
TORCH = ["engine=torch", "engine.dtype=float32"]
SCORE_TOL = 1e-4  # float32 on both engines
NEAR_TIE = 1e-3  # top-2 logit gap under which two float32 engines may pick different tokens



def cfg(*overrides):
    return compose_cfg(*TINY, *overrides, small=False)


def checked(*overrides):
    server = build_server(cfg(*overrides))
    server.__class__ = CheckedServer
    server.checks = 0
    rec = server.run()
    assert server.checks > 5
    return server, rec


@functools.lru_cache(maxsize=None)
def run(*overrides):
    return checked(*overrides)


# ---------------------------------------------------------------- PRM


def _paths(fmt, rng, n_paths):
    """Token-id PRM inputs: several questions, paths of 1-4 steps, many sharing prefixes."""
    rows, contents = [], []
    for i in range(n_paths):
        question = rng.choice(["What is 2+2?", "Solve x^2 = 9.", "A train leaves at noon; when does it arrive?"])
        if contents and rng.random() < 0.5:  # extend an earlier path: a shared prefix
            q, prev = rng.choice(contents)
            question, steps = q, prev + [[rng.randrange(10, 400) for _ in range(rng.randrange(2, 30))]]
        else:
            steps = [[rng.randrange(10, 400) for _ in range(rng.randrange(2, 60))] for _ in range(rng.randrange(1, 4))]
        contents.append((question, steps))
        inp = fmt.encode_pieces(question, steps)
        rows.append(PRMRow(inp.token_ids, 0, None, inp.reward_positions))
    return rows


def test_prm_rewards_equal_ours():
    backend, _ = _backend()
    ours = ProcessRewardModel(ensure_tiny_models()["qwen2_prm_h64"], dtype=torch.float32)
    rng = random.Random(0)
    for size in (1, 7, 24):
        rows = _paths(ours.format, rng, size)
        got, seconds = backend.prm_engine.score_rows(rows)
        want = ours.score_rows(rows)
        assert seconds > 0
        for g, w in zip(got, want):
            assert len(g) == len(w) and g == pytest.approx(w, abs=SCORE_TOL, rel=0)
    # Not a degenerate head: rewards vary.
    assert len({round(x, 4) for r in got for x in r}) > 5


@functools.lru_cache(maxsize=None)
def _backend():
    from specscale.engine.vllm.build import build_vllm

    return build_vllm(CellSpec.from_config(cfg(*VLLM)))


# ---------------------------------------------------------------- trees


def _divergences(server_a, server_b):
    """Candidates with the same lineage key and the same history whose steps differ:
    (history, step a, step b) for each, earliest divergences only."""
    by_key = {}
    for req in server_b.finished:
        for c in req.search.candidates:
            by_key[(req.request_id, c.key, c.round)] = c
    out = []
    for req in server_a.finished:
        for c in req.search.candidates:
            other = by_key.get((req.request_id, c.key, c.round))
            if other is None or c.round < 0 or c.step_tokens == other.step_tokens:
                continue
            history = list(req.prompt) + [t for p in c.path()[:-1] for t in p.step_tokens]
            other_history = list(req.prompt) + [t for p in other.path()[:-1] for t in p.step_tokens]
            if history == other_history:
                out.append((history, c.step_tokens, other.step_tokens))
    return out


def _top2_gap(history, a, b) -> float:
    """Logit gap between the two best tokens where steps a and b first differ (float64 reference)."""
    from transformers import AutoModelForCausalLM

    k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_models()["qwen2_h64"]), dtype=torch.float64)
    with torch.no_grad():
        logits = model(torch.tensor([history + a[:k]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def test_greedy_trees_agree_with_torch():
    ts, ref = run("policy=nonspec", "search.temperature=0", *TORCH)
    vs, got = run("policy=nonspec", "search.temperature=0", *VLLM)
    rounds, _ = frames(got)
    assert len(rounds) >= 3 * 3 and sum(len(t) for t in rounds["member_texts"]) > 0
    try:
        assert_same_tree(got, ref, "greedy vllm vs torch", score_tol=SCORE_TOL)
    except AssertionError:
        div = _divergences(vs, ts)
        assert div, "the trees differ but no candidate's step differs: scores or selections disagree"
        gaps = [_top2_gap(*d) for d in div]
        assert all(g < NEAR_TIE for g in gaps), f"greedy steps differ without a near-tie (top-2 gaps {gaps})"


def test_seeded_policies_build_identical_trees():
    """Per-request seeds from lineage keys: equivalent policies build one tree on vLLM.
    (vLLM's CPU kernels gave batch-invariant results here; VLLM_BATCH_INVARIANT is CUDA-only.)"""
    seeded = ["search.temperature=1.0", "seed=3"]
    _, ref = run("policy=nonspec", *seeded, *VLLM)
    rounds, _ = frames(ref)
    assert any(len({tuple(t) for t in texts}) > 1 for texts in rounds["member_texts"])  # siblings differ
    for policy, extra in EQUIVALENT:
        if policy in ("nonspec", "nonspec_cd", "fasttts"):
            continue
        _, rec = run(f"policy={policy}", *extra, *seeded, *VLLM)
        assert_same_tree(rec, ref, f"{policy} on vllm")


# ---------------------------------------------------------------- KV and preemption


def test_small_pool_preempts_and_kv_returns_to_baseline():
    """22 blocks for 3 concurrent problems (15 blocks of prompt each): vLLM preempts, the
    greedy tree is the unconstrained one (engine=torch, a large pool), and at the end
    every vLLM block is free again (aborted and finished requests released theirs)."""
    ts, ref = run("policy=nonspec", "search.temperature=0", *TORCH)
    for policy in ("nonspec", "full"):
        vs, rec = run(f"policy={policy}", "policy.pruning=strict", "search.temperature=0", *VLLM) if policy == "full" \
            else run("policy=nonspec", "search.temperature=0", *VLLM)
        assert vs.blocks.num_blocks == SMALL_POOL - 1  # vLLM keeps one null block
        assert vs.blocks.num_used == 0 and vs.gen.vllm_unfinished() == 0
        assert rec.leaked_blocks == 0 and rec.leaked_sequences == 0
        assert rec.kv_peak_blocks <= vs.blocks.num_blocks
        assert_same_tree(rec, ref, f"{policy} greedy, small vLLM pool", score_tol=SCORE_TOL)
    vs, rec = run("policy=nonspec", "search.temperature=0", *VLLM)
    assert vs.gen.total_preemptions > 0 and rec.preemptions == vs.gen.total_preemptions
    # Two of vLLM's own counts agree (nonspec aborts nothing): tokens its scheduler ran as
    # prefill = prompt tokens not found in its prefix cache + tokens recomputed on resumption.
    prefill = sum(r["prefill_tokens"] for r in rec.iterations)
    assert vs.gen.aborted_requests == 0 and vs.gen.recomputed_prefill_tokens > 0
    assert prefill == vs.gen.prompt_tokens_computed + vs.gen.recomputed_prefill_tokens


def test_every_policy_runs_and_reports_engine_features(tmp_path):
    for policy in ("spec", "ep", "ep_cd", "full", "fasttts"):
        summary = run_cell(cfg(f"policy={policy}", "search.temperature=1.0", *VLLM), tmp_path / policy)
        features = summary["engine_features"]
        assert features["engine"] == "vllm" and features["token_level_cd"] is False
        assert features["token_level_cd_requested"] is (policy in ("ep_cd", "full"))  # named, not silent
        assert summary["leaked_blocks"] == 0 and summary["vllm_kv_used_blocks_end"] == 0
        # Accounting from vLLM itself: PRM tokens are what vLLM computed (whole paths).
        assert summary["prm_tokens"] == summary["vllm_prm_tokens_computed"] > 0
        assert summary["vllm_prompt_tokens_cached"] > 0  # children re-find their parents' blocks
        assert summary["time_generation_s"] > 0 and summary["time_verification_s"] > 0
        total = summary["time_generation_s"] + summary["time_verification_s"] + summary["time_other_s"]
        assert total == pytest.approx(summary["makespan_s"], rel=1e-6)
        assert summary["output_tok_s"] == pytest.approx(summary["output_tokens"] / summary["makespan_s"])
        # Losing speculative branches were aborted inside vLLM (and their KV freed: see above).
        assert summary["cancelled_candidates"] > 0 and summary["vllm_aborted_requests"] > 0
