"""The testbed's two architectures, as transformers Qwen2 configs.

head_dim is 64 (vLLM's CPU attention takes head sizes 32, 64, 80, 96, 112, 128, ...:
two heads of 64 over a 128-wide model). The PRM has the generator's body, so it starts
from the generator's weights (it already computes the sums it has to check), plus the
Qwen2.5-Math-PRM ``score`` head (Linear(h, h) -> ReLU -> Linear(h, 2), read at every
``<extra_0>``); while training it also keeps a language-model loss through the tied
embeddings, which is not part of the checkpoint.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

BODY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)  # fmt: skip


def qwen2_config(tokenizer, **overrides):
    from transformers import Qwen2Config

    from specscale.testbed.tokenizer import VOCAB_SIZE

    body = {**BODY, **overrides}
    return Qwen2Config(
        vocab_size=VOCAB_SIZE, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        use_sliding_window=False, attention_dropout=0.0, initializer_range=0.02,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **body,
    )  # fmt: skip


def generator(tokenizer, seed: int, **overrides):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(qwen2_config(tokenizer, **overrides))


class PRMForTraining(nn.Module):
    """Qwen2 body + the Qwen2.5-Math-PRM score head; names match the released checkpoint."""

    def __init__(self, config):
        super().__init__()
        from transformers import Qwen2Model

        self.config = config
        self.model = Qwen2Model(config)
        h = config.hidden_size
        self.score = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 2))

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden

    def lm_logits(self, hidden):
        return hidden @ self.model.embed_tokens.weight.T

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}


def prm_from_generator(gen, seed: int, extra_layers: int = 0) -> PRMForTraining:
    """The generator's body (+ ``extra_layers`` new decoder layers on top) with a fresh score head.

    Why extra layers: checking "a-b=c" means comparing the digits of c with what the body
    predicts for them, and the body only finishes that prediction in its last layer; new
    layers after it have both at hand. They start as exact identities (their output
    projections are zero, so each adds nothing to the residual stream) and the PRM starts
    out computing exactly what the generator computes."""
    torch.manual_seed(seed)
    cfg = copy.deepcopy(gen.config)
    cfg.num_hidden_layers = gen.config.num_hidden_layers + extra_layers
    if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
        cfg.layer_types = [cfg.layer_types[0]] * cfg.num_hidden_layers
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = cfg.num_hidden_layers
    prm = PRMForTraining(cfg)
    missing, unexpected = prm.model.load_state_dict(gen.model.state_dict(), strict=False)
    new = {f"layers.{i}." for i in range(gen.config.num_hidden_layers, cfg.num_hidden_layers)}
    if unexpected or any(not any(m.startswith(n) for n in new) for m in missing):
        raise RuntimeError(f"generator body does not fit the PRM: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for layer in prm.model.layers[gen.config.num_hidden_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return prm
