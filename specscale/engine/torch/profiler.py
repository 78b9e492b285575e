"""Micro-benchmarks of the torch engine's own work, the inputs of a cost profile
(specscale/engine/cost_profile.py): generation iterations and PRM batches over a grid of
shapes (``gen_points``, ``prm_points``), timed interleaved (``measure``), and the speed
probe that says how fast this machine is right now (``speed_probe``). Used by the profiler
(``python -m runners.profile_engine``) and by the fidelity check (``python -m
analysis.fidelity``), which also share the short search (``SHORT_SEARCH``) and the
scheduler settings a sim run takes from the torch run it predicts (``scheduler_limits``).
"""
from __future__ import annotations

import functools
import itertools
import platform
import statistics
import time
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from specscale.compose import compose_config
from specscale.engine.backend import resolve_seconds
from specscale.engine.cost_profile import GEN_FEATURES, PRM_FEATURES, gen_features, prm_features
from specscale.engine.text.prm_rows import PRMRow
from specscale.engine.torch.attention.batch import BatchRow
from specscale.frozen_heap import frozen_heap

RAGGED_SHORT = 32
PROBE_REPS = 5  # a reading's repeats per batch: a warm reading took 36 ms on the tiny pair (2-core CPU VM)
# The speed probe: two small batches (16 decode rows at 128 tokens; 16 PRM tasks of 32 new
# tokens over 128 cached), timed between the grid's rounds (the profile records their median)
# and again around every serving cell and fidelity run: how fast the machine was then,
# against when it was profiled. A shared VM's speed drifts by tens of percent within minutes.
PROBE_GRID = {"decode_rows": (16,), "decode_ctx": (128,), "prefill": (), "prefill_cached": (), "mixed_rows": (),
              "mixed_prefill": (), "ragged_rows": (), "ragged_long": (), "prm_tasks": (16,), "prm_new": (32,),
              "prm_cached": (128,), "ragged_tasks": (), "ragged_new": (), "ragged_cached": ()}
# Engine settings that shape the schedule (rows and tokens per iteration, PRM packing,
# caching): a sim run compared with a torch run takes the torch engine's values.
SCHEDULER_KEYS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "prefix_caching", "prm_prefix_cache",
                  "prm_max_batch_tokens")
# The short synthetic search the host-cost cells run (and analysis.fidelity's cells): many
# rounds of short steps, so a tiny pair serves a whole search in about a second.
SHORT_SEARCH = ("engine.synthetic.step_len_median=6.0", "engine.synthetic.steps_median=4.0",
                "engine.synthetic.content_vocab=64", "search.max_rounds=6", "search.step_token_cap=24",
                "search.path_token_cap=96", "expansion=2")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def measure(points: Sequence[tuple[dict, Callable[[], float]]], reps: int,
            between: Optional[Callable[[], object]] = None) -> pd.DataFrame:
    """Time every point ``reps`` times, interleaved: each round runs all points once, so a
    point never follows itself. Serving alternates generation and PRM batches of every
    shape, with host work between them; back-to-back repeats of one batch would find its
    weights and KV in cache and under-price it (measured: ~10% on the CPU). One warm-up
    call per point first (allocator, first-call kernels). Median kept, quartiles beside it.
    The heap is frozen while it runs, as in a serving run (``specscale.frozen_heap``).
    ``between`` is called before each round and after the last (the profiler's speed probe:
    the machine's speed sampled across the whole table, not at its two ends)."""
    times = [[] for _ in points]
    with frozen_heap():  # as the serving loop's wall clock (specscale/frozen_heap.py)
        for _, fn in points:
            fn()
        for _ in range(reps):
            if between is not None:
                between()
            for ts, (_, fn) in zip(times, points):
                ts.append(fn())
        if between is not None:
            between()
    out = []
    for (row, _), ts in zip(points, times):
        q = np.percentile(ts, [25, 75])
        out.append({**row, "median_s": statistics.median(ts), "p25_s": float(q[0]), "p75_s": float(q[1]),
                    "reps": reps})
    return pd.DataFrame(out)


def speed_probe(runner, prm, reps: int = PROBE_REPS) -> float:
    """Seconds of the probe batches (``PROBE_GRID``, medians of ``reps`` each, summed) on
    this engine now."""
    with torch.inference_mode():
        return float(measure([*gen_points(runner, PROBE_GRID), *prm_points(prm, PROBE_GRID)], reps)["median_s"].sum())


def gen_points(runner, grid: dict) -> list[tuple[dict, Callable[[], float]]]:
    """Generation iterations of the grid: decode rows x context, prefill chunks x cached
    prefix, and mixed decode + prefill; each a (features, timed call) pair."""
    bs, cap, vocab = runner.block_size, runner.num_blocks, runner.config.vocab_size
    points = []

    def timed_call(rows: list[BatchRow], want: list[int]) -> Callable[[], float]:
        def work():
            b = runner.make_batch(rows)
            h = runner.forward(b)
            return runner.compute_logits(h, b, want)
        # resolve_seconds waits for the device: the next call starts on an idle stream
        return lambda: resolve_seconds(runner.timed(work)[1])

    for n, ctx in itertools.product(grid["decode_rows"], grid["decode_ctx"]):
        per = -(-(ctx + 1) // bs)
        if n * per > cap or ctx + 1 > runner.max_model_len:
            continue  # does not fit this engine's pool / window: not measured
        rows = [BatchRow([i % vocab], ctx, list(range(i * per, (i + 1) * per))) for i in range(n)]
        points.append(({"kind": "decode", **dict(zip(GEN_FEATURES, gen_features([ctx + 1] * n, [], n)))},
                       timed_call(rows, list(range(n)))))
    for n, cached in itertools.product(grid["prefill"], grid["prefill_cached"]):
        blocks = -(-(cached + n) // bs)
        if blocks > cap or cached + n > runner.max_model_len:
            continue
        rows = [BatchRow([(7 * i) % vocab for i in range(n)], cached, list(range(blocks)))]
        points.append(({"kind": "prefill", **dict(zip(GEN_FEATURES, gen_features([], [(n, cached)], 1)))},
                       timed_call(rows, [0])))
    ctx = 128  # decode rows and one prefill chunk in one iteration, as a chunked-prefill step runs them
    for n, chunk in itertools.product(grid["mixed_rows"], grid["mixed_prefill"]):
        per = -(-(ctx + 1) // bs)
        if (n + 1) * per > cap or ctx + 1 > runner.max_model_len:
            continue
        rows = [BatchRow([i % vocab], ctx, list(range(i * per, (i + 1) * per))) for i in range(n)]
        rows.append(BatchRow([(5 * i) % vocab for i in range(chunk)], 0, list(range(n * per, n * per + per))))
        points.append(({"kind": "mixed", **dict(zip(GEN_FEATURES, gen_features([ctx + 1] * n, [(chunk, 0)], n + 1)))},
                       timed_call(rows, list(range(n + 1)))))
    for n, long in itertools.product(grid["ragged_rows"], grid["ragged_long"]):
        ctxs = [RAGGED_SHORT] * (n - 1) + [long]
        pers = [-(-(c + 1) // bs) for c in ctxs]
        if sum(pers) > cap or long + 1 > runner.max_model_len:
            continue
        starts = np.cumsum([0, *pers])
        rows = [BatchRow([i % vocab], c, list(range(starts[i], starts[i + 1]))) for i, c in enumerate(ctxs)]
        points.append(({"kind": "ragged", **dict(zip(GEN_FEATURES, gen_features([c + 1 for c in ctxs], [], n)))},
                       timed_call(rows, list(range(n)))))
    return points


def prm_points(prm, grid: dict) -> list[tuple[dict, Callable[[], float]]]:
    """PRM batches of the grid: tasks x new tokens x cached prefix over the paged PRM cache."""
    if prm.kv_cache is None:
        raise SystemExit("profile_engine: the PRM has no KV pool; profile with engine.prm_prefix_cache=true")
    bs, cap, vocab = prm.block_size, prm.kv_cache.num_blocks, prm.config.vocab_size
    points = []
    for tasks, new, cached in itertools.product(grid["prm_tasks"], grid["prm_new"], grid["prm_cached"]):
        per = -(-(cached + new) // bs)
        if tasks * per > cap or cached + new > prm.max_model_len:
            continue
        rows = [PRMRow([(3 * i + t) % vocab for i in range(new)], cached, list(range(t * per, (t + 1) * per)),
                       [new - 1]) for t in range(tasks)]
        points.append(({"kind": "prm", **dict(zip(PRM_FEATURES, prm_features([(new, cached)] * tasks)))},
                       functools.partial(prm_runner_time, prm, rows)))
    for tasks, new, long in itertools.product(grid["ragged_tasks"], grid["ragged_new"], grid["ragged_cached"]):
        cached = [RAGGED_SHORT] * (tasks - 1) + [long]
        pers = [-(-(c + new) // bs) for c in cached]
        if sum(pers) > cap or long + new > prm.max_model_len:
            continue
        starts = np.cumsum([0, *pers])
        rows = [PRMRow([(3 * i + t) % vocab for i in range(new)], c, list(range(starts[t], starts[t + 1])), [new - 1])
                for t, c in enumerate(cached)]
        points.append(({"kind": "prm", **dict(zip(PRM_FEATURES, prm_features([(new, c) for c in cached])))},
                       functools.partial(prm_runner_time, prm, rows)))
    return points


def prm_runner_time(prm, rows) -> float:
    t0 = time.perf_counter()
    prm.score_rows(rows)  # returns host lists: the device work is finished when it returns
    return time.perf_counter() - t0


def scheduler_limits(torch_overrides: Sequence[str]) -> list[str]:
    """The torch engine's scheduling limits as overrides for the sim: with the sim's own
    (1,024 rows per iteration against torch's 256) both build the same tree but run a
    different schedule, and the sim would predict an execution the engine never ran."""
    eng = compose_config(list(torch_overrides), resolve=True)["engine"]
    return [f"++engine.{k}={eng[k]}" for k in SCHEDULER_KEYS if eng.get(k) is not None]
