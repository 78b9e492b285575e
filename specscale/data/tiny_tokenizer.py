"""A tiny byte-level BPE tokenizer with a Qwen-style chat template, built offline.

For tests and CPU smoke runs only: no hub download, trained in milliseconds on a
few sentences. Byte-level BPE can encode any text (no unknown tokens), and the
special tokens are the Qwen ones, so prompts look like a real Qwen2 prompt.
"""

from __future__ import annotations

from typing import Iterable

from specscale.data.prompts import QWEN_STYLE_CHAT_TEMPLATE, SYSTEM_PROMPT

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_DEFAULT_CORPUS = (
    SYSTEM_PROMPT,
    "What is 12 + 30?",
    "## Step 1: Add the numbers\n12 + 30 = 42.\n\n",
    "Therefore, the final answer is: $\\boxed{42}$. I hope it is correct.",
    "Solve for x: 2x + 3 = 11. Subtract 3 and divide by 2, so x = 4.",
    "\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}",
)


def build_tiny_tokenizer(
    corpus: Iterable[str] = _DEFAULT_CORPUS,
    vocab_size: int = 400,
    chat_template: str = QWEN_STYLE_CHAT_TEMPLATE,
):
    """A ``transformers`` fast tokenizer (eos = ``<|im_end|>``, pad = ``<|endoftext|>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )
