"""Training sequences, token for token what the harness feeds the models when serving.

Generator: the chat-templated question with the generation prompt (as
``specscale.data.prompts.build_generator_prompt`` renders it with this tokenizer,
whose template drops the system turn), then the solution, then ``<|im_end|>``; the loss
covers the assistant part. PRM: the Qwen2.5-Math-PRM rendering (user question,
assistant steps each followed by ``<extra_0>``, ``<|im_end|>\\n``), as
``QwenMathPRMFormat.encode`` builds it (a test checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specscale.testbed.prm_data import LabelledPath

STEP_TAG = "<extra_0>"
IGNORE = -100


def prompt_text(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def prm_text(question: str, steps) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n" + "".join(
        s + STEP_TAG for s in steps) + "<|im_end|>\n"  # fmt: skip


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor
    lm_labels: torch.Tensor  # [B, T] next-token targets (IGNORE where no LM loss)
    tag_index: tuple[torch.Tensor, torch.Tensor] | None = None  # (row, position) of each step tag
    tag_labels: torch.Tensor | None = None  # 0/1 per tag


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def generator_batch(tokenizer, questions: list[str], solutions: list[str]) -> Batch:
    prompts = tokenizer([prompt_text(q) for q in questions], add_special_tokens=False)["input_ids"]
    answers = tokenizer([s + "<|im_end|>" for s in solutions], add_special_tokens=False)["input_ids"]
    ids = [p + a for p, a in zip(prompts, answers)]
    # labels[t] = ids[t + 1] where token t + 1 belongs to the answer
    labels = [[IGNORE] * (len(p) - 1) + a + [IGNORE] for p, a in zip(prompts, answers)]
    pad = tokenizer.pad_token_id
    input_ids = _pad(ids, pad)
    return Batch(input_ids, _pad([[1] * len(r) for r in ids], 0), _pad(labels, IGNORE))


def prm_batch(tokenizer, paths: list[LabelledPath]) -> Batch:
    """PRM inputs with their step-tag positions and labels; an LM target on every token of
    the assistant part before the first wrong step (the PRM keeps computing the right
    arithmetic, which is what it checks against)."""
    tag_id = tokenizer.convert_tokens_to_ids(STEP_TAG)
    encoded = tokenizer([prm_text(p.question, p.steps) for p in paths], add_special_tokens=False)["input_ids"]
    prompt_lens = [len(x) for x in tokenizer([prompt_text(p.question) for p in paths], add_special_tokens=False)["input_ids"]]
    rows, cols, ys, lm = [], [], [], []
    for r, (ids, path, q_len) in enumerate(zip(encoded, paths, prompt_lens)):
        tags = [i for i, t in enumerate(ids) if t == tag_id]
        if len(tags) != len(path.steps):
            raise ValueError(f"step text holds {STEP_TAG!r}: {path.steps}")
        rows += [r] * len(tags)
        cols += tags
        ys += list(path.labels)
        first = path.first_error
        # LM targets: tokens after the assistant header up to the last right step's tag.
        stop = tags[first - 1] + 1 if first is not None and first > 0 else (q_len if first == 0 else len(ids))
        labels = [IGNORE] * len(ids)
        for t in range(q_len - 1, stop - 1):
            if ids[t + 1] != tag_id:
                labels[t] = ids[t + 1]
        lm.append(labels)
    pad = tokenizer.pad_token_id
    return Batch(_pad(encoded, pad), _pad([[1] * len(r) for r in encoded], 0), _pad(lm, IGNORE),
                 (torch.tensor(rows), torch.tensor(cols)), torch.tensor(ys, dtype=torch.long))  # fmt: skip
