"""Synthetic problems for the simulator: a difficulty, a question length, a reference."""
from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import betaincinv, ndtri

from specscale.hashing import combine, mix64, to_unit


@dataclass(frozen=True)
class SimProblem:
    id: str
    answer: str
    difficulty: float  # in (0, 1): scales the chance a path loses track at a step
    prompt_tokens: int  # the question's tokens (what the PRM sees of the prompt)
    key: int  # hash identity, seeds its prompt tokens and wrong answers
    template_tokens: int = 0  # the generator prompt's system prompt and chat scaffold, before the question


def synthetic_problems(
    dataset: str,
    n: int,
    difficulty_mean: float,
    prompt_tokens_mean: float,
    difficulty_concentration: float = 4.0,
    prompt_tokens_sigma: float = 0.35,
    template_tokens: int = 0,
) -> list[SimProblem]:
    """The first n synthetic problems of a dataset; fixed across seeds and policies.

    Difficulty ~ Beta(c*m, c*(1-m)) with mean m and concentration c; prompt length is
    log-normal around prompt_tokens_mean with shape prompt_tokens_sigma. Every generator
    prompt also holds ``template_tokens`` of system prompt and chat scaffold (the same
    tokens for every problem, as a real system prompt is).
    """
    if n < 1:
        raise ValueError(f"n_problems must be >= 1, got {n}")
    if not 0.0 < difficulty_mean < 1.0:
        raise ValueError(f"difficulty_mean must lie in (0, 1), got {difficulty_mean}")
    base = mix64(sum(ord(ch) << (8 * (i % 7)) for i, ch in enumerate(dataset)))
    out = []
    for i in range(n):
        key = combine(base, i)
        conc = difficulty_concentration
        d = float(betaincinv(conc * difficulty_mean, conc * (1 - difficulty_mean), to_unit(combine(key, 1))))
        z = float(ndtri(min(max(to_unit(combine(key, 2)), 1e-9), 1 - 1e-9)))
        sig = prompt_tokens_sigma  # exp(sig*z - sig^2/2) has mean 1: the mean length is prompt_tokens_mean
        length = max(8, int(round(prompt_tokens_mean * math.exp(sig * z - sig * sig / 2))))
        out.append(SimProblem(f"{dataset}-{i:05d}", str(combine(key, 3) % 1000), d, length, key,
                              int(template_tokens)))
    return out
