"""A tiny, self-built model set in real Hugging Face checkpoint format.

No hub access is needed: tokenizers are trained here on generated math text,
weights are seeded random tensors written with the checkpoints' real names.

  qwen2      Qwen2ForCausalLM, q/k/v bias, tied embeddings, model.safetensors
  llama      LlamaForCausalLM, llama3 rope scaling, untied, sharded + index json
  qwen2_prm  Qwen2ForProcessRewardModel (score head), bf16 weights, <extra_0> steps
  llama_prm  LlamaForCausalLM read as an RLHFlow "+"/"-" PRM

and the same four at a vLLM-compatible size (``*_h64``: head_dim 64, the smallest
head size vLLM's CPU attention takes; hidden 128, 2 query heads, 1 KV head), for
``model=tiny_vllm`` on both ``engine=torch`` and ``engine=vllm``.

Built under ``$SPECSCALE_CACHE/tiny`` (default ``~/.cache/specscale/tiny``) on
first use; later calls only check a completion stamp.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from specscale.testbed.tokenizer import llama_tokenizer, qwen_tokenizer, save_tokenizer

TINY_VERSION = "1"
_STAMP = ".specscale-tiny-complete"
BODY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# vLLM's CPU attention supports head_dim in {32, 64, 80, ...}: head_dim 16 above fails there.
# Its window is 4096 positions, so a PRM input of a long path fits vLLM's max_model_len
# (vLLM refuses a max_model_len past max_position_embeddings).
BODY_H64 = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=4096)  # fmt: skip
VOCAB_SIZE = 512  # model vocab; the trained tokenizers are a little smaller, as in real Qwen checkpoints
MAX_POSITIONS = 1024
EMBED_STD = 0.3
LM_HEAD_GAIN = 3.0
# original_max_position_embeddings=256 puts the 8 RoPE frequencies of head_dim 16 in all
# three llama3 bands (kept, smoothed, divided by factor).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}  # fmt: skip


def default_tiny_root() -> Path:
    base = os.environ.get("SPECSCALE_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "specscale") / "tiny"


def ensure_tiny_models(root: str | Path | None = None) -> dict[str, Path]:
    """Build (once) and return {name: checkpoint dir} for the tiny model set."""
    root = Path(root) if root is not None else default_tiny_root()
    root.mkdir(parents=True, exist_ok=True)
    builders = {}
    for suffix, body in (("", BODY), ("_h64", BODY_H64)):
        builders.update({
            f"qwen2{suffix}": functools.partial(_build_qwen2, body=body),
            f"llama{suffix}": functools.partial(_build_llama, body=body),
            f"qwen2_prm{suffix}": functools.partial(_build_qwen2_prm, body=body),
            f"llama_prm{suffix}": functools.partial(_build_llama_prm, body=body),
        })
    paths = {}
    for name, build in builders.items():
        target = root / name
        paths[name] = target
        if _is_complete(target):
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            build(tmp)
            (tmp / _STAMP).write_text(TINY_VERSION)
            _make_readable(tmp)
            if target.exists():  # stale or partial build
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:
                if not _is_complete(target):  # lost a race to a concurrent builder only if it finished
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _make_readable(path: Path) -> None:
    # mkdtemp / safetensors create private files; the cache is meant to be shared.
    path.chmod(0o755)
    for f in path.iterdir():
        f.chmod(0o644)


def _is_complete(path: Path) -> bool:
    stamp = path / _STAMP
    return stamp.is_file() and stamp.read_text() == TINY_VERSION


# ---------------------------------------------------------------- weights


def _body_weight_names(qkv_bias: bool, body: dict = BODY) -> dict[str, tuple[int, ...]]:
    h, i = body["hidden_size"], body["intermediate_size"]
    d = h // body["num_attention_heads"]
    q, kv = body["num_attention_heads"] * d, body["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB_SIZE, h)}
    for layer in range(body["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for proj, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[p + f"self_attn.{proj}.weight"] = (out, h)
            if qkv_bias:
                shapes[p + f"self_attn.{proj}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    return shapes


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Seeded weights scaled so activations stay O(1) and logits are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float64)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            t = 0.1 * noise
        elif name.endswith("embed_tokens.weight"):
            # Small next to the layers' output, so hidden states depend on context and
            # not only on the current token (PRM scores then vary along a path).
            t = EMBED_STD * noise
        elif name == "lm_head.weight":  # logit std ~3: peaked next-token distributions
            t = LM_HEAD_GAIN * noise / math.sqrt(shape[1])
        else:  # linear: fan-in scaling
            t = noise / math.sqrt(shape[1])
        out[name] = t.to(dtype).contiguous()
    return out


def _save_weights(tensors: dict[str, torch.Tensor], path: Path, shards: int = 1) -> None:
    from safetensors.torch import save_file

    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, str(path / fname), metadata={"format": "pt"})
        for n, t in part.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _config(arch: str, model_type: str, tokenizer, body: dict = BODY, **extra) -> dict:
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        **body,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "use_cache": True,
        "transformers_version": "4.45.0",
    }
    cfg.update(extra)
    assert len(tokenizer) <= VOCAB_SIZE, "tokenizer larger than the model vocabulary"
    return cfg


def _qwen_extra(tie: bool, dtype: str, body: dict = BODY) -> dict:
    return dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie, torch_dtype=dtype,
                use_sliding_window=False, sliding_window=body.get("max_position_embeddings", MAX_POSITIONS), max_window_layers=body["num_hidden_layers"],
                attention_dropout=0.0)  # fmt: skip


def _llama_extra(body: dict = BODY) -> dict:
    return dict(rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE), rms_norm_eps=1e-5, tie_word_embeddings=False,
                attention_bias=False, mlp_bias=False, torch_dtype="float32", pretraining_tp=1,
                head_dim=body["hidden_size"] // body["num_attention_heads"], attention_dropout=0.0)  # fmt: skip


def _write(path: Path, config: dict, tensors: dict[str, torch.Tensor], tokenizer, tok_class: str, shards=1) -> None:
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _save_weights(tensors, path, shards)
    save_tokenizer(tokenizer, path, tok_class)


def _build_qwen2(path: Path, body: dict = BODY) -> None:
    tok = qwen_tokenizer()
    tensors = random_weights(_body_weight_names(True, body), seed=1)
    _write(path, _config("Qwen2ForCausalLM", "qwen2", tok, body, **_qwen_extra(True, "float32", body)), tensors, tok,
           "Qwen2Tokenizer")  # fmt: skip


def _build_llama(path: Path, body: dict = BODY, seed: int = 2, shards: int = 2) -> None:
    tok = llama_tokenizer()
    shapes = _body_weight_names(False, body)
    shapes["lm_head.weight"] = (VOCAB_SIZE, body["hidden_size"])
    tensors = random_weights(shapes, seed=seed)
    _write(path, _config("LlamaForCausalLM", "llama", tok, body, **_llama_extra(body)), tensors, tok,
           "PreTrainedTokenizerFast", shards=shards)  # fmt: skip


def _build_qwen2_prm(path: Path, body: dict = BODY) -> None:
    tok = qwen_tokenizer()
    h = body["hidden_size"]
    shapes = _body_weight_names(True, body)
    shapes.update({"score.0.weight": (h, h), "score.0.bias": (h,), "score.2.weight": (2, h), "score.2.bias": (2,)})
    tensors = random_weights(shapes, seed=3, dtype=torch.bfloat16)  # released PRM ships bf16
    cfg = _config("Qwen2ForProcessRewardModel", "qwen2", tok, body, **_qwen_extra(False, "bfloat16", body))
    _write(path, cfg, tensors, tok, "Qwen2Tokenizer")


def _build_llama_prm(path: Path, body: dict = BODY) -> None:
    """The RLHFlow PRM is a Llama causal LM (its reward is two token logits): the
    generator's build with its own weights, in one shard."""
    _build_llama(path, body, seed=4, shards=1)
