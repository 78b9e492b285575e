"""Tokenizer + chat template from a local checkpoint directory (never the hub)."""

from __future__ import annotations

from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_dir: str | Path):
    """``AutoTokenizer.from_pretrained(model_dir)`` restricted to local files."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {model_dir}")
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in {model_dir}")
    from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def render_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> list[int]:
    """Apply the checkpoint's chat template and tokenize the result.

    The template already writes BOS / role markers, so the tokenizer must not add
    its own special tokens again (Llama 3's tokenizer would prepend a second BOS).
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
