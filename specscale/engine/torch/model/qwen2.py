"""Qwen2 / Qwen2.5: decoder with q/k/v biases; generator and Math-PRM variants.

The architectural differences from Llama (biases on q/k/v only, no o_proj bias)
are decided in ``ModelConfig``; this file adds what is Qwen-specific on top of
the shared body: the process-reward classifier head of Qwen2.5-Math-PRM.
"""

from __future__ import annotations

import torch
from torch import nn

from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.decoder import CausalLM, DecoderModel


class Qwen2ForCausalLM(CausalLM):
    """Qwen2.5 generator (tied embeddings for the small sizes, per config)."""


class Qwen2ForProcessRewardModel(nn.Module):
    """Qwen2.5-Math-PRM: decoder body + ``score`` = Linear(h, h) -> ReLU -> Linear(h, 2).

    Weight names match the released checkpoint: ``model.*``, ``score.0.*``,
    ``score.2.*``. The step reward is softmax(score(h))[..., 1] at every
    ``<extra_0>`` position.
    """

    num_labels = 2

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        h = config.hidden_size
        self.score = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, self.num_labels))

    def forward(self, input_ids, positions, backend, plan, kv_cache=None) -> torch.Tensor:
        return self.model(input_ids, positions, backend, plan, kv_cache)

    def step_rewards(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, h] at separator positions -> P(step is good) [N]."""
        logits = self.score(hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)[:, 1]

    @staticmethod
    def ignored_checkpoint_keys(config: ModelConfig) -> set[str]:
        # The reward model has no LM head; tolerate exports that still carry one.
        return {"lm_head.weight"}
