"""Held-out measurements of the testbed models (transformers forward passes, CPU).

* generator: greedy / sampled accuracy on problems of the shipped test split;
* PRM: step AUC on held-out paths, overall and at the first wrong step (a path's
  right steps against the steps where it first went wrong), on planted errors and on
  the generator's own samples, labelled by checking them against the reference
  solution (``label_steps``).

AUC is the Mann-Whitney U statistic over n_pos * n_neg (scipy), ties counted half.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from specscale.data.arith import ArithProblem
from specscale.data.prompts import STEP_DELIMITER
from specscale.grading import extract_boxed
from specscale.testbed.encode import prm_batch, prompt_text
from specscale.testbed.prm_data import LabelledPath, sample_path


def auc(pos: list[float], neg: list[float]) -> float:
    from scipy.stats import mannwhitneyu

    if not pos or not neg:
        return float("nan")
    return float(mannwhitneyu(pos, neg).statistic) / (len(pos) * len(neg))


@torch.no_grad()
def sample(model, tokenizer, questions: list[str], *, temperature: float, seed: int, max_new_tokens: int = 64,
           batch: int = 64) -> list[str]:  # fmt: skip
    """One completion per question (temperature 0 = greedy), decoded without special tokens."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    out: list[str] = []
    for i in range(0, len(questions), batch):
        enc = tokenizer([prompt_text(q) for q in questions[i : i + batch]], add_special_tokens=False,
                        return_tensors="pt", padding=True)  # fmt: skip
        kw = dict(do_sample=True, temperature=temperature, top_k=None, top_p=None) if temperature > 0 else dict(do_sample=False)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, **kw)  # fmt: skip
        out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    tokenizer.padding_side = "right"
    return out


def is_correct(problem: ArithProblem, text: str) -> bool:
    return extract_boxed(text) == str(problem.answer)


def label_steps(problem: ArithProblem, text: str) -> LabelledPath:
    """A generated solution split at the step delimiter; a step is right when it and every
    step before it match the reference solution (which is unique for this format)."""
    steps = [s for s in text.split(STEP_DELIMITER) if s.strip()]
    ref = problem.steps()
    labels, ok = [], True
    for i, s in enumerate(steps):
        ok = ok and i < len(ref) and s.strip() == ref[i]
        labels.append(int(ok))
    return LabelledPath(problem.question, tuple(steps), tuple(labels))


@torch.no_grad()
def prm_scores(prm, tokenizer, paths: list[LabelledPath], batch: int = 64) -> list[list[float]]:
    """p(+) per step, read at each step tag (the Qwen2.5-Math-PRM rule)."""
    tokenizer.padding_side = "right"
    out: list[list[float]] = []
    for i in range(0, len(paths), batch):
        chunk = paths[i : i + batch]
        b = prm_batch(tokenizer, chunk)
        hidden = prm(b.input_ids, b.attention_mask)
        p = prm.score(hidden[b.tag_index]).float().softmax(-1)[:, 1].tolist()
        k = 0
        for path in chunk:
            out.append(p[k : k + len(path.steps)])
            k += len(path.steps)
    return out


@dataclass
class StepAUC:
    overall: float
    first_wrong: float
    n_right: int
    n_first_wrong: int


def step_auc(paths: list[LabelledPath], scores: list[list[float]]) -> StepAUC:
    right, wrong, first = [], [], []
    for path, s in zip(paths, scores):
        for i, (y, v) in enumerate(zip(path.labels, s)):
            (right if y else wrong).append(v)
            if i == path.first_error:
                first.append(v)
    return StepAUC(auc(right, wrong), auc(right, first), len(right), len(first))


def planted_paths(problems: list[ArithProblem], seed: int) -> list[LabelledPath]:
    rng = random.Random(seed)
    return [sample_path(p, rng) for p in problems]
