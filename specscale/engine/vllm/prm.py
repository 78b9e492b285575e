"""The PRM as a second vLLM engine, one scorer per PRM format.

* Qwen2.5-Math-PRM (``VLLMPRM``): vLLM runs ``Qwen2ForProcessRewardModel`` with the
  pooling runner; with ``pooler_config={"step_tag_id": <id of <extra_0>>}`` and
  ``PoolingParams(task="token_classify")`` it returns one softmaxed [p(-), p(+)] row per
  step tag of the input, in order; a step's reward is p(+), the same head our torch PRM
  computes (``softmax(score(h))[1]``). Token-wise pooling never reads vLLM's prefix
  cache (``PoolingParams`` sets ``skip_reading_prefix_cache`` for token_classify: the
  pooler locates step tags over the whole prompt), so every task computes its whole path.

* RLHFlow Llama PRM (``VLLMNextTokenPRM``): a plain causal LM on the generation runner.
  A step's reward is read at the last token of its assistant header, i.e. from the
  distribution of the *next* token after the prefix that ends there, so each reward
  position is one generation request: prompt = the path's PRM ids up to and including
  that position, ``max_tokens=1``, greedy, ``logprob_token_ids=[+, -]``. vLLM's V1
  sampler (the CPU runner's too) gathers those two ids from the *raw* log-softmax of
  the model's logits (``logprobs_mode="raw_logprobs"``, computed before temperature,
  penalties or any logits processor), so p(+) / (p(+) + p(-)) =
  sigmoid(logprob(+) - logprob(-)) = softmax(logits[[+, -]])[0], exactly our torch
  head. (Sample ``logprob_token_ids`` run on V1; only the *prompt* variant,
  ``prompt_logprob_token_ids``, needs the V2 runner.) vLLM's automatic prefix caching
  is on for this engine: a path's step prefixes and its ancestors' share their KV
  blocks (whole 32-token blocks; a prefix's last partial block is recomputed), and
  ``num_cached_tokens`` says how much each request read from the cache.
  Identical prefixes within one call are sent once.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Sequence

from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.vllm.features import PRMBatch


@dataclass
class PRMCounts:
    tokens_computed: int = 0  # prompt tokens vLLM computed (prompt - num_cached_tokens)
    tokens_cached: int = 0  # prompt tokens vLLM read from its prefix cache
    requests: int = 0  # vLLM requests (Qwen: one per path; RLHFlow: one per distinct step prefix)


def _check_whole(i: int, row: PRMRow) -> None:
    if row.block_table is not None or row.start:
        raise ValueError(f"PRM row {i}: vLLM's PRM scores whole paths only (engine.prm_prefix_cache=false)")


class VLLMPRM:
    """Qwen2.5-Math-PRM: step-tag pooling, one request per path."""

    scoring = "step_tag_pooling"
    prefix_sharing = False  # token-wise pooling skips reading vLLM's prefix cache

    def __init__(self, llm, step_tag_id: int) -> None:
        from vllm.pooling_params import PoolingParams

        self.llm = llm
        self.step_tag_id = step_tag_id
        self._params = PoolingParams(task="token_classify")
        self._ids = itertools.count()
        self.counts = PRMCounts()
        # One per score_rows call (= one recorded PRM batch): per vLLM request, the tokens it
        # computed and the tokens vLLM found in its prefix cache (engine.vllm.replay).
        self.batches: list[PRMBatch] = []

    def score_rows(self, rows: Sequence[PRMRow]) -> tuple[list[list[float]], float]:
        """Rewards at each row's reward positions (whole paths, uncached rows) and the
        seconds taken; the tokens vLLM computed and read from its cache add to ``counts``."""
        pending: dict[str, int] = {}
        t0 = time.perf_counter()
        for i, row in enumerate(rows):
            _check_whole(i, row)
            ids = [int(t) for t in row.token_ids]  # PRMPaths rows hold numpy ids
            tags = [p for p, t in enumerate(ids) if t == self.step_tag_id]
            if tags != list(row.reward_positions):
                raise ValueError(
                    f"PRM row {i}: step tags at {tags[:8]} but rewards are read at {list(row.reward_positions)[:8]}: "
                    "step-tag pooling needs exactly one step tag per step and nowhere else"
                )
            rid = f"p{next(self._ids)}"
            self.llm.add_request(rid, {"prompt_token_ids": ids}, self._params)
            pending[rid] = i
        results: list[list[float]] = [[] for _ in rows]
        computed = cached = 0
        batch = PRMBatch()
        while pending:
            for out in self.llm.step():
                if not out.finished:
                    continue
                i = pending.pop(out.request_id)
                data = out.outputs.data
                if data.shape[0] != len(rows[i].reward_positions):
                    raise RuntimeError(
                        f"PRM row {i}: vLLM pooled {data.shape[0]} step rows, {len(rows[i].reward_positions)} expected"
                    )
                results[i] = data[:, 1].double().tolist()
                hit = int(out.num_cached_tokens or 0)
                cached += hit
                computed += len(rows[i].token_ids) - hit
                batch.tasks.append((len(rows[i].token_ids) - hit, hit))
        seconds = time.perf_counter() - t0
        self.batches.append(batch)
        self.counts.tokens_computed += computed
        self.counts.tokens_cached += cached
        self.counts.requests += len(rows)
        return results, seconds


class VLLMNextTokenPRM:
    """RLHFlow "+"/"-" PRM: one greedy one-token request per step prefix, the two ids'
    raw logprobs gathered by vLLM's sampler (``logprob_token_ids``)."""

    scoring = "next_token_logprob_token_ids"
    prefix_sharing = True  # vLLM's automatic prefix caching across step prefixes and paths

    def __init__(self, llm, plus_id: int, minus_id: int) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.plus_id, self.minus_id = int(plus_id), int(minus_id)
        self._params = SamplingParams(
            max_tokens=1, temperature=0.0, logprob_token_ids=[self.plus_id, self.minus_id], detokenize=False,
            skip_special_tokens=False,
        )
        self._ids = itertools.count()
        self.counts = PRMCounts()
        # One per score_rows call (= one recorded PRM batch): per vLLM request, the tokens it
        # computed and the tokens vLLM found in its prefix cache (engine.vllm.replay).
        self.batches: list[PRMBatch] = []

    def reward(self, logprobs) -> float:
        """p(+) / (p(+) + p(-)) from the two raw logprobs (float64, overflow-free)."""
        d = float(logprobs[self.minus_id].logprob) - float(logprobs[self.plus_id].logprob)
        return 1.0 / (1.0 + math.exp(d)) if d < 700 else 0.0

    def score_rows(self, rows: Sequence[PRMRow]) -> tuple[list[list[float]], float]:
        """Rewards at each row's reward positions and the seconds taken; what vLLM
        computed and read from its prefix cache adds to ``counts``."""
        t0 = time.perf_counter()
        by_prompt: dict[tuple[int, ...], str] = {}
        wanted: list[list[str]] = []
        for i, row in enumerate(rows):
            _check_whole(i, row)
            ids = tuple(int(t) for t in row.token_ids)
            rids = []
            for p in row.reward_positions:
                prompt = ids[: p + 1]
                rid = by_prompt.get(prompt)
                if rid is None:
                    rid = by_prompt[prompt] = f"q{next(self._ids)}"
                    self.llm.add_request(rid, {"prompt_token_ids": list(prompt)}, self._params)
                rids.append(rid)
            wanted.append(rids)
        lengths = {rid: len(prompt) for prompt, rid in by_prompt.items()}
        rewards: dict[str, float] = {}
        computed = cached = 0
        batch = PRMBatch()
        while len(rewards) < len(lengths):
            for out in self.llm.step():
                if not out.finished or out.request_id not in lengths:
                    continue
                logprobs = out.outputs[0].logprobs
                if not logprobs or self.plus_id not in logprobs[0] or self.minus_id not in logprobs[0]:
                    raise RuntimeError(f"vLLM returned no logprobs of '+'/'-' for PRM request {out.request_id}")
                rewards[out.request_id] = self.reward(logprobs[0])
                hit = int(out.num_cached_tokens or 0)
                cached += hit
                computed += lengths[out.request_id] - hit
                batch.tasks.append((lengths[out.request_id] - hit, hit))
        seconds = time.perf_counter() - t0
        self.batches.append(batch)
        self.counts.tokens_computed += computed
        self.counts.tokens_cached += cached
        self.counts.requests += len(lengths)
        return [[rewards[r] for r in rids] for rids in wanted], seconds
