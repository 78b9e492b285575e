"""The project's tokenizers, all byte-level BPE trained locally (HF ``tokenizers``), with
digits one token each (the Qwen2 / Llama 3 split pattern) and the specials and chat
markup of the real checkpoints. No hub download: they train in well under a second.

* ``qwen_tokenizer`` / ``llama_tokenizer``: the tiny model set (tiny_models.py; model=tiny
  and the tests), trained on generated math-word-problem text. Qwen
  ``<|im_start|>role\ncontent<|im_end|>\n`` turns; Llama 3 header blocks, BOS prepended.
* ``testbed_tokenizer``: the testbed pair (model=testbed), trained on arith text. Its chat
  template renders user and assistant turns and leaves out system turns: the testbed
  models were trained without a system prompt, because the harness's search-and-learn
  system prompt (~1,000 characters, ~250 tokens) would triple every sequence, and with it
  the CPU time of training and serving, for no signal on this task. ``<|im_end|>`` is EOS,
  ``<extra_0>`` the Qwen2.5-Math-PRM step tag.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from specscale.data.arith import ArithSpec, problems

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Llama 3 / Qwen2 pre-tokenizer split pattern (digits one at a time, as in Qwen2).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


TESTBED_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
TESTBED_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 320  # BPE target (bytes + specials + merges); the models' vocab is the same


def word_problem_corpus(n_lines: int = 1500, seed: int = 0) -> list[str]:
    """Deterministic math-word-problem flavoured text for tokenizer training."""
    rng = random.Random(seed)
    names = ["Alice", "Bob", "Carla", "Dan", "Eve", "Farid", "Grace"]
    things = ["apples", "books", "coins", "marbles", "pencils", "tickets", "dollars"]
    templates = [
        "{n} has {a} {t}. {m} gives {n} {b} more {t}. How many {t} does {n} have now?",
        "Step {k}: We add {a} and {b} to get {a} + {b} = {s}.",
        "Step {k}: Subtract {b} from {a}, so {a} - {b} = {d}.",
        "Let x = {a}. Then 2x + {b} = {e}, so the value is {e}.",
        "Multiply {a} by {b}: {a} * {b} = {p}. Therefore the total is {p}.",
        "The answer is \\boxed{{{s}}}.",
        "We need to find the number of {t} that {n} and {m} have together.",
        "Since {a} < {s}, the equation x^2 - {b}x + {a} = 0 has two roots.",
        "Please reason step by step, and put your final answer within \\boxed{{}}.",
        "Question: what is {a} divided by {b}? Answer: {q}",
    ]
    lines = ["system user assistant", "+ - = * / ( ) [ ] { } \\frac \\boxed \\sqrt", "\n\n"]
    for _ in range(n_lines):
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        lines.append(
            rng.choice(templates).format(
                n=rng.choice(names), m=rng.choice(names), t=rng.choice(things), k=rng.randint(1, 9),
                a=a, b=b, s=a + b, d=a - b, e=2 * a + b, p=a * b, q=round(a / b, 2),
            )  # fmt: skip
            + rng.choice(["\n\n", "\n", " "])
        )
    return lines


def arith_corpus(seed: int, n: int = 2000) -> list[str]:
    stream = problems(seed, ArithSpec(min_ops=1, max_ops=6, operators="+-*"))
    texts = ["<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n"] * 50
    for _ in range(n):
        p = next(stream)
        texts.append(p.question + "\n" + p.solution + "\n\n")
    random.Random(seed).shuffle(texts)
    return texts


def train_tokenizer(corpus: list[str], specials: list[str], template: str | None, *, bos: str | None, eos: str,
                    pad: str | None, vocab_size: int):  # fmt: skip
    """Byte-level BPE trained locally on ``corpus`` (digits one token each: SPLIT_PATTERN),
    wrapped as a transformers fast tokenizer with the given specials and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    if bos is not None:  # Llama 3 style: the tokenizer itself prepends BOS
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    named = {bos, eos, pad}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=[s for s in specials if s not in named],
    )
    fast.chat_template = template
    return fast


def save_tokenizer(tokenizer, path: Path, tokenizer_class: str) -> None:
    tokenizer.save_pretrained(str(path))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = tokenizer_class  # what the real checkpoints declare
    cfg_path.write_text(json.dumps(cfg, indent=2))


def qwen_tokenizer():
    return train_tokenizer(word_problem_corpus(), QWEN_SPECIALS, QWEN_TEMPLATE, bos=None, eos="<|im_end|>",
                           pad="<|endoftext|>", vocab_size=480)


def llama_tokenizer():
    return train_tokenizer(word_problem_corpus(), LLAMA_SPECIALS, LLAMA_TEMPLATE, bos="<|begin_of_text|>",
                           eos="<|eot_id|>", pad=None, vocab_size=480)


def testbed_tokenizer(seed: int = 0):
    """The testbed's tokenizer (deterministic for ``seed``)."""
    fast = train_tokenizer(arith_corpus(seed), TESTBED_SPECIALS, TESTBED_TEMPLATE, bos=None, eos="<|im_end|>",
                           pad="<|endoftext|>", vocab_size=VOCAB_SIZE)
    if len(fast) > VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(fast)} tokens > model vocab {VOCAB_SIZE}")
    return fast
