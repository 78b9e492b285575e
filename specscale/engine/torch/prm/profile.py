"""Start-up profile of PRM batch times: the torch PRM's cost curve before serving.

Adaptive verification (specscale.verify) prices a flush with the PRM cost curve C(batch).
The sim has it in closed form; a real PRM has to be timed. Fitting only the batches of
the run itself leaves the first decisions blind (no batch timed yet: waiting looks free).
So, for cells that use ``policy.verification=adaptive``, the build times a few packed
PRM batches of task-sized inputs before the clock starts (warm-up, reported in
``runner.warmup_seconds``, never charged to the policy) and hands the points to the
monitor, whose measured curve starts from them and keeps refitting as batches run.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

TASK_TOKENS = 64  # a typical PRM task (one step + its format tokens) on a cached prefix
TASK_COUNTS = (1, 4, 16, 32)  # batch sizes, capped by engine.prm_max_batch_tokens
REPEATS = 3  # timed repetitions per size after one untimed run; the median is kept


def task_batch(prm: Any, n_tasks: int, task_tokens: int, seed: int = 0) -> list:
    """n_tasks in-vocabulary PRM inputs of task_tokens tokens, one reward at each end."""
    from specscale.engine.text.prm_format import PRMInput

    g = torch.Generator().manual_seed(seed)
    n = min(task_tokens, prm.max_model_len)
    return [PRMInput(tuple(torch.randint(0, prm.config.vocab_size, (n,), generator=g).tolist()), (n - 1,))
            for _ in range(n_tasks)]


def profile_prm_curve(prm: Any, synchronize: Callable[[], None], max_batch_tokens: int,
                      task_tokens: int = TASK_TOKENS) -> tuple[tuple[int, float], ...]:
    """((new tokens, median seconds), ...) of packed PRM batches of TASK_COUNTS tasks."""
    points = []
    for k in TASK_COUNTS:
        if k > 1 and k * task_tokens > max_batch_tokens:
            break
        inputs = task_batch(prm, k, task_tokens, seed=k)
        prm.score_token_ids(inputs)  # untimed: first use of this shape
        synchronize()
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            prm.score_token_ids(inputs)
            synchronize()
            times.append(time.perf_counter() - t0)
        points.append((sum(len(i.token_ids) for i in inputs), statistics.median(times)))
    return tuple(points)
