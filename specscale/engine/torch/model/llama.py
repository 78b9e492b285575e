"""Llama 3.x: decoder without biases (unless ``attention_bias``/``mlp_bias``),
RoPE with the "llama3" frequency scaling handled in ``rotary.py``.

Also the body of the RLHFlow Llama3.1-8B PRM, which is a plain causal LM whose
step reward is read from the "+" / "-" logits (see ``prm.py``).
"""

from __future__ import annotations

from specscale.engine.torch.model.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    """Llama 3.x generator; tied embeddings for 3.2-1B/3B, untied for 3.1-8B (per config)."""
