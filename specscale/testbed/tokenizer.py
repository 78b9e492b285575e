"""The testbed tokenizer: byte-level BPE (HF ``tokenizers``) trained on arith text.

Digits stay one token each (the Qwen2 split pattern), which is what lets a small model
do column arithmetic. Specials and chat markup follow Qwen2.5 (``<|im_start|>``,
``<|im_end|>`` = EOS, ``<extra_0>`` = the Qwen2.5-Math-PRM step tag).

The chat template renders user and assistant turns and leaves out system turns: the
testbed models were trained without a system prompt, because the harness's
search-and-learn system prompt (~1,000 characters, ~250 tokens) would triple every
sequence, and with it the CPU time of training and serving, for no signal on this task.
"""

from __future__ import annotations

import random

from specscale.data.arith import ArithSpec, problems
from specscale.engine.torch.tiny_tokenizer import SPLIT_PATTERN

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 320  # BPE target (bytes + specials + merges); the models' vocab is the same


def _corpus(seed: int, n: int = 2000) -> list[str]:
    stream = problems(seed, ArithSpec(min_ops=1, max_ops=6, operators="+-*"))
    texts = ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n"] * 50
    for _ in range(n):
        p = next(stream)
        texts.append(p.question + "\n" + p.solution + "\n\n")
    random.Random(seed).shuffle(texts)
    return texts


def build_tokenizer(seed: int = 0):
    """A transformers fast tokenizer (deterministic for ``seed``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<extra_0>"])  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) > VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(fast)} tokens > model vocab {VOCAB_SIZE}")
    return fast
