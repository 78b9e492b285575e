"""Architecture facts of the paper's models: their public ``config.json`` files.

``model.load_format=random`` builds a model from one of these (or from a local
checkpoint's / tiny model's config.json) with random weights, so real-size engine
cost can be measured without downloading any weights. ``reduced`` shrinks a config
(width, depth, vocabulary) while keeping its architecture code path (Qwen2 bias,
Llama-3 RoPE scaling, tied head, PRM head, grouped-query attention), for CPU tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
# hf_name -> stored config.json (copied from each model's public config).
PAPER_CONFIGS = {
    "Qwen/Qwen2.5-3B-Instruct": "qwen2.5-3b-instruct.json",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct.json",
    "Qwen/Qwen2.5-Math-PRM-7B": "qwen2.5-math-prm-7b.json",
    "meta-llama/Llama-3.2-3B-Instruct": "llama-3.2-3b-instruct.json",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct.json",
    # A full fine-tune of Llama-3.1-8B-Instruct: the same architecture, a plain causal LM.
    "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data": "rlhflow-llama3.1-8b-prm-deepseek-data.json",
}


def paper_config(hf_name: str) -> dict[str, Any]:
    """The stored config.json of a paper model, as a dict (KeyError if not stored)."""
    return json.loads((HERE / PAPER_CONFIGS[hf_name]).read_text())


def config_for(hf_name: str) -> dict[str, Any]:
    """config.json of ``hf_name`` without weights: a stored paper config, a tiny model's,
    a testbed model's, or a local checkpoint directory's. FileNotFoundError when none applies."""
    if hf_name in PAPER_CONFIGS:
        return paper_config(hf_name)
    if hf_name.startswith("tiny/"):
        from specscale.testbed.tiny_models import ensure_tiny_models

        paths = ensure_tiny_models()
        name = hf_name[len("tiny/"):]
        if name in paths:
            return json.loads((paths[name] / "config.json").read_text())
    if hf_name.startswith("testbed/"):
        from specscale.testbed import CHECKPOINTS, checkpoint_dir

        name = hf_name[len("testbed/"):]
        if name in CHECKPOINTS and (checkpoint_dir(name) / "config.json").is_file():
            return json.loads((checkpoint_dir(name) / "config.json").read_text())
    path = Path(hf_name).expanduser() / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    raise FileNotFoundError(
        f"no stored architecture for {hf_name!r}: load_format=random knows {sorted(PAPER_CONFIGS)}, "
        "tiny/<name>, testbed/<name>, or a local directory holding a config.json"
    )


def reduced(raw: dict[str, Any], hidden: int = 64, layers: int = 2, vocab: int | None = 512,
            intermediate: int = 128, heads: int = 4) -> dict[str, Any]:
    """The same architecture at reduced size: grouped-query attention is kept (kv heads
    < heads when the original has it), as are bias, RoPE type/scaling and head kind."""
    out = dict(raw)
    kv = heads if raw.get("num_key_value_heads", raw["num_attention_heads"]) == raw["num_attention_heads"] else 2
    out.update(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads)
    if vocab is not None:
        out["vocab_size"] = vocab
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # keep special ids inside the vocab
            if isinstance(out.get(key), int):
                out[key] = out[key] % vocab
            elif isinstance(out.get(key), list):
                out[key] = [t % vocab for t in out[key]]
    return out
