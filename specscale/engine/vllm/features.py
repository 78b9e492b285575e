"""What each vLLM iteration and PRM batch computed, in the terms of the profiled cost model.

vLLM samples with its own sampler and schedules with its own scheduler, so the sim cannot
rebuild a vLLM run's search tree. What can be checked is the cost model: every iteration
vLLM ran is described by the features ``specscale.engine.sim.profiled.gen_features``
prices (decode rows' contexts, prefill chunks with their cached prefix, rows that need
logits), every PRM batch by ``prm_features``' (tasks' new and cached tokens), read from
vLLM itself (``SchedulerProbe``; the PRM requests' ``num_cached_tokens``), and kept in the
order the recorder records the calls (``specscale.engine.vllm.replay`` pairs them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specscale.engine.cost_profile import gen_features, prm_features


@dataclass
class GenIteration:
    decode_ctx: list[int] = field(default_factory=list)  # per decode row: context it attends (computed + 1)
    prefill: list[tuple[int, int]] = field(default_factory=list)  # per prefill: (new tokens, cached tokens)
    logit_rows: int = 0

    def features(self) -> np.ndarray:
        return gen_features(self.decode_ctx, self.prefill, self.logit_rows)


@dataclass
class PRMBatch:
    tasks: list[tuple[int, int]] = field(default_factory=list)  # per vLLM request: (computed, cached) tokens

    def features(self) -> np.ndarray:
        return prm_features(self.tasks)
