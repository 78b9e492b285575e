"""How fast this machine's interpreter is right now: the host half of a profile's speed probe.

A profile's host terms (``HostCostModel``: scheduling, bookkeeping, the search woken by
finished steps) are Python work, and a machine's Python speed need not move with its
device speed (a GPU box's host CPU is a different chip from its GPU; a shared VM's CPU
drifts on its own). So a profile records two probes: the device probe
(``specscale.engine.torch.profiler.speed_probe``: small generation and PRM batches) and
this one, a fixed piece of the kind of work the serving loop's host side does (dict
updates, tuple building, sorting, a heap), timed on its own. Only ratios of it are read:
its seconds now over its seconds when the profile was made.
"""
from __future__ import annotations

import heapq
import statistics
import time

_ITEMS = 20_000


def _work() -> float:
    t0 = time.perf_counter()
    counts: dict[int, int] = {}
    rows = []
    for i in range(_ITEMS):
        key = (i * 7919) % 4099
        counts[key] = counts.get(key, 0) + 1
        rows.append((key, -i, str(key)))
    rows.sort()
    heap = [r[:2] for r in rows[::4]]
    heapq.heapify(heap)
    while heap:
        heapq.heappop(heap)
    return time.perf_counter() - t0


def host_probe(reps: int = 7) -> float:
    """Median seconds of the fixed host work (one warm-up call first)."""
    _work()
    return float(statistics.median(_work() for _ in range(reps)))
