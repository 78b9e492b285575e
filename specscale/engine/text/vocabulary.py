"""Token <-> text rules the torch backend needs from the generator's tokenizer.

* which sampled ids end a path (EOS and the chat's end-of-turn token),
* which ids end a step (their decoded text contains the step delimiter "\\n\\n";
  the delimiter stays in the generated text, so the next round continues after it),
* how a finished step becomes the text the PRM reads (special tokens dropped, the
  trailing delimiter removed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from specscale.data.prompts import STEP_DELIMITER

# End-of-turn tokens of common chat formats; used only when present in the vocabulary
# and marked special, as a fallback to what the chat template itself reveals.
_END_OF_TURN_NAMES = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>")


def _as_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def end_of_turn_ids(tokenizer) -> set[int]:
    """The special token(s) the chat template writes right after an assistant message."""
    content = "7 + 8 = 15"
    messages = [{"role": "user", "content": "1"}, {"role": "assistant", "content": content}]
    found: set[int] = set()
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template without an assistant role: fall back to known names
        text = None
    special = set(tokenizer.all_special_ids)
    if text is not None and content in text:
        rest = text[text.rindex(content) + len(content):]
        ids = tokenizer(rest, add_special_tokens=False)["input_ids"]
        if ids and ids[0] in special:
            found.add(ids[0])
    vocab = tokenizer.get_vocab()
    for name in _END_OF_TURN_NAMES:
        tid = vocab.get(name)
        if tid is not None and tid in special and name in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>"):
            found.add(tid)
    return found


def eos_token_ids(tokenizer, model_dir: str | Path, config_eos, vocab_size: int) -> frozenset[int]:
    """Tokenizer EOS + config/generation-config EOS + the chat's end-of-turn token(s)."""
    ids = set(_as_ids(tokenizer.eos_token_id)) | set(_as_ids(config_eos)) | end_of_turn_ids(tokenizer)
    gen_cfg = Path(model_dir) / "generation_config.json"
    if gen_cfg.is_file():
        try:
            ids |= set(_as_ids(json.loads(gen_cfg.read_text()).get("eos_token_id")))
        except (json.JSONDecodeError, TypeError, ValueError):
            pass  # a broken generation config only loses the extra EOS ids
    ids = {i for i in ids if 0 <= i < vocab_size}
    if not ids:
        raise ValueError(f"cannot find an EOS token for the generator in {model_dir}")
    return frozenset(ids)


def delimiter_token_ids(tokenizer, vocab_size: int, delimiter: str = STEP_DELIMITER) -> frozenset[int]:
    """Ids whose decoded text contains the step delimiter (special tokens excluded)."""
    n = min(len(tokenizer), vocab_size)
    special = set(tokenizer.all_special_ids)
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    return frozenset(i for i, t in enumerate(texts) if delimiter in t and i not in special)


def special_strings(tokenizer) -> list[str]:
    """Texts of every special / added token: never allowed inside step text given to a PRM."""
    names = set(tokenizer.all_special_tokens)
    for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(tok, "special", False):
            names.add(str(tok))
    return sorted((n for n in names if n), key=len, reverse=True)


def step_text(
    tokenizer, token_ids: Iterable[int], ended_at_delimiter: bool, forbidden: Iterable[str] = (),
    delimiter: str = STEP_DELIMITER,
) -> str:
    """What the PRM reads for one step.

    Special tokens (EOS, end of turn) are not text. A step cut at the delimiter loses
    the delimiter and anything after it within that last token ("\\n\\n\\n" too).
    Strings the PRM's tokenizer would parse as its own special tokens (its step
    separator above all) are removed, so a generated path can never break the PRM
    prompt format.
    """
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    if ended_at_delimiter:
        cut = text.rfind(delimiter)
        if cut >= 0:
            text = text[:cut].rstrip("\r\n")
    for s in forbidden:
        if s in text:
            text = text.replace(s, "")
    return text
