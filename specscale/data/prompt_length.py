"""How many tokens the generator's prompt template adds to every question.

The simulator has no tokenizer, but its prompts must be as long as the real ones: the
system prompt (``specscale.data.prompts.SYSTEM_PROMPT``) and the chat template's
scaffolding precede every question, and their KV is part of every request's footprint.

The count is made offline, without the model hub, from the tokenizers' pre-tokenizer:
Qwen2 and Llama 3 split text with the same GPT-4-style pattern before BPE, and BPE
merges never cross a piece, so the number of pieces is a lower bound on the token
count; in a 128K-152K vocabulary every common English word is one token, so the bound
is close (a piece like "$\\boxed" may take two or three). Special tokens count one each.

    python -m specscale.data.prompt_length     # prints the count per chat format
"""
from __future__ import annotations

import sys

import regex

from specscale.data.prompts import SYSTEM_PROMPT

# The pre-tokenizer pattern of Qwen2's and Llama 3's tokenizer.json (digits: Qwen2
# splits every digit; Llama 3 groups up to three; the template has no digits but "1", "2").
PRETOKENIZE = regex.compile(
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The text each chat template puts around the system prompt and the question, with
# special tokens written as <|...|>. Qwen2.5: its tokenizer's chat_template with a
# system turn. Llama 3.1: its template's system header (knowledge cut-off and date
# lines) and turn headers.
CHAT_SCAFFOLDS = {
    "qwen2": ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
              "<|im_start|>assistant\n"),
    "llama": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{system}<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n"),
}
_SPECIAL = regex.compile(r"<\|[a-z_]+\|>")


def piece_count(text: str) -> int:
    """Pre-tokenizer pieces of plain text (a lower bound on its BPE tokens)."""
    return len(PRETOKENIZE.findall(text))


def template_tokens(arch: str, system_prompt: str = SYSTEM_PROMPT) -> int:
    """Tokens the generator prompt holds besides the question, for a chat format."""
    try:
        scaffold = CHAT_SCAFFOLDS[arch]
    except KeyError:
        raise ValueError(f"no chat scaffold for arch {arch!r}; known: {sorted(CHAT_SCAFFOLDS)}") from None
    text = scaffold.replace("{system}", system_prompt)
    before, after = text.split("{question}")
    total = 0
    for part in (before, after):
        specials = _SPECIAL.findall(part)
        total += len(specials) + sum(piece_count(t) for t in _SPECIAL.split(part))
    return total


def main() -> int:
    for arch in CHAT_SCAFFOLDS:
        print(f"{arch}: {template_tokens(arch)} template tokens (system prompt {piece_count(SYSTEM_PROMPT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
