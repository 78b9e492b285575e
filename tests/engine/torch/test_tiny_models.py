"""The self-built tiny checkpoints: complete, idempotent, loadable by transformers."""

from __future__ import annotations

import json

from specscale.testbed.tiny_models import default_tiny_root, ensure_tiny_models
from specscale.engine.text.tokenizer import load_tokenizer, render_chat


def test_layout(tiny):
    base = {"qwen2", "llama", "qwen2_prm", "llama_prm"}
    assert set(tiny) == base | {f"{n}_h64" for n in base}
    for name in base:  # the vLLM-compatible size: head_dim 64 (vLLM's CPU attention has no 16)
        cfg = json.loads((tiny[f"{name}_h64"] / "config.json").read_text())
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
        assert cfg["architectures"] == json.loads((tiny[name] / "config.json").read_text())["architectures"]
    for path in tiny.values():
        assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    index = json.loads((tiny["llama"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2  # sharded checkpoint
    assert not (tiny["llama"] / "model.safetensors").exists()
    assert (tiny["qwen2"] / "model.safetensors").is_file()


def test_idempotent(tiny):
    stamp = {n: (p / "config.json").stat().st_mtime_ns for n, p in tiny.items()}
    again = ensure_tiny_models(next(iter(tiny.values())).parent)
    assert again == tiny
    assert {n: (p / "config.json").stat().st_mtime_ns for n, p in again.items()} == stamp


def test_default_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSCALE_CACHE", str(tmp_path))
    assert default_tiny_root() == tmp_path / "tiny"


def test_tokenizers_and_chat_templates(tiny):
    qwen = load_tokenizer(tiny["qwen2_prm"])
    assert qwen.convert_tokens_to_ids("<extra_0>") != qwen.unk_token_id
    ids = render_chat(qwen, [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
    assert qwen.decode(ids) == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    llama = load_tokenizer(tiny["llama"])
    ids = render_chat(llama, [{"role": "user", "content": " What is 2 + 3? "}], add_generation_prompt=True)
    assert llama.decode(ids) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    text = "Step 1: 12 + 5 = 17.\n\nThe answer is \\boxed{17}."
    for tok in (qwen, llama):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
