"""engine=vllm with the RLHFlow "+"/"-" PRM (model=tiny_vllm_rlhflow): vLLM scores each
step prefix with one greedy one-token request whose sampler gathers the raw logprobs of
"+" and "-" (``SamplingParams.logprob_token_ids``); its step rewards equal our torch
PRM's, and a search runs end to end on the Llama pair.

One pair of vLLM engines (generator + generation-runner PRM) serves the module.
"""
from __future__ import annotations

import functools
import random

import pytest
import torch

from cfg_helpers import compose_cfg
from contract import assert_same_tree, frames

from specscale.cell import build_server, run_cell
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.prm_rows import PRMRow
from specscale.testbed.tiny_models import ensure_tiny_models
from specscale.settings import CellSpec

pytestmark = pytest.mark.usefixtures("one_thread")
SCORE_TOL = 1e-4  # float32 on both engines
RUN = [
    "engine=vllm", "model=tiny_vllm_rlhflow", "dataset=fixture_math500", "progress=false", "wandb.mode=disabled",
    "n_problems=2", "search.max_rounds=3", "search.step_token_cap=12", "search.path_token_cap=48", "beam=4",
    "expansion=2", "concurrency=2", "engine.max_model_len=512",
]



def cfg(*overrides):
    return compose_cfg(*RUN, *overrides, small=False)


@functools.lru_cache(maxsize=None)
def _backend():
    from specscale.engine.vllm.build import build_vllm

    return build_vllm(CellSpec.from_config(cfg()))


def _rows(fmt, rng, n_paths):
    """Several questions, paths of 1-4 steps of 1-50 tokens, half of them extending an
    earlier path of the batch (a shared prefix, as siblings and children have)."""
    rows, paths = [], []
    questions = ["What is 2+2?", "Solve x^2 = 9.", "A train leaves at noon; when does it arrive?"]
    for _ in range(n_paths):
        if paths and rng.random() < 0.5:
            question, prev = rng.choice(paths)
            steps = prev + [[rng.randrange(10, 400) for _ in range(rng.randrange(1, 30))]]
        else:
            question = rng.choice(questions)
            steps = [[rng.randrange(10, 400) for _ in range(rng.randrange(1, 50))] for _ in range(rng.randrange(1, 4))]
        paths.append((question, steps))
        inp = fmt.encode_pieces(question, steps)
        rows.append(PRMRow(inp.token_ids, 0, None, inp.reward_positions))
    return rows


def test_rlhflow_prm_rewards_equal_ours():
    backend, _ = _backend()
    prm = backend.prm_engine
    assert backend.engine_features["prm_head"] == "next_token_logprob_token_ids"
    ours = ProcessRewardModel(ensure_tiny_models()["llama_prm_h64"], dtype=torch.float32)
    assert ours.format.name == "rlhflow"
    rng = random.Random(0)
    for size in (1, 7, 24):
        rows = _rows(ours.format, rng, size)
        before = (prm.counts.tokens_computed, prm.counts.tokens_cached, prm.counts.requests)
        got, seconds = prm.score_rows(rows)
        want = ours.score_rows(rows)
        assert seconds > 0
        for g, w in zip(got, want):
            assert len(g) == len(w) and g == pytest.approx(w, abs=SCORE_TOL, rel=0)
        # Accounting from vLLM: one request per distinct step prefix; each request's prompt
        # is computed or read from vLLM's prefix cache (num_cached_tokens).
        prefixes = {tuple(r.token_ids[: p + 1]) for r in rows for p in r.reward_positions}
        computed, cached = prm.counts.tokens_computed - before[0], prm.counts.tokens_cached - before[1]
        assert prm.counts.requests - before[2] == len(prefixes)
        assert computed + cached == sum(len(p) for p in prefixes) and computed > 0
    assert cached > 0  # step prefixes share KV blocks
    # Rescoring the last batch reads (almost) everything from the cache and gives the same rewards.
    again, _ = prm.score_rows(rows)
    assert [x for r in again for x in r] == pytest.approx([x for r in got for x in r], abs=1e-6)
    assert prm.counts.tokens_cached - before[1] - cached > prm.counts.tokens_computed - before[0] - computed
    assert len({round(x, 4) for r in got for x in r}) > 5  # not a degenerate head
    assert not backend.engines.prm.has_unfinished_requests()


def test_rlhflow_search_runs_without_leaks(tmp_path):
    summary = run_cell(cfg("policy=nonspec", "search.temperature=1.0", "seed=1"), tmp_path / "nonspec")
    features = summary["engine_features"]
    assert features["engine"] == "vllm" and features["prm_head"] == "next_token_logprob_token_ids"
    assert features["prm_prefix_sharing"] == "vllm_automatic_prefix_caching"
    assert summary["leaked_blocks"] == 0  # run_cell itself raises on leaked blocks or sequences
    assert summary["vllm_kv_used_blocks_end"] == 0
    assert summary["output_tokens"] > 0 and summary["time_verification_s"] > 0
    # PRM accounting from vLLM: requests per step prefix, computed + cached prompt tokens.
    assert summary["vllm_prm_requests"] > 0 and summary["vllm_prm_tokens_computed"] > 0
    assert summary["vllm_prm_tokens_cached"] > 0
    assert not _backend()[0].engines.prm.has_unfinished_requests()


def test_rlhflow_greedy_tree_equals_torch():
    """Greedy nonspec on the Llama pair: the same tree on engine=torch and engine=vllm,
    every step score within 1e-4 (the near-tie fallback of test_vllm_engine was not
    needed: no greedy step differs on this pair)."""
    greedy = ["policy=nonspec", "search.temperature=0"]
    ref = build_server(compose_cfg(*[o for o in RUN if not o.startswith("engine")], *greedy, "engine=torch",
                                   "engine.dtype=float32", small=False)).run()
    got = build_server(cfg(*greedy)).run()
    rounds, _ = frames(got)
    assert len(rounds) >= 2 * 2 and sum(len(t) for t in rounds["member_texts"]) > 0
    assert_same_tree(got, ref, "greedy rlhflow vllm vs torch", score_tol=SCORE_TOL)
