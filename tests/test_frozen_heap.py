"""The timed loops' frozen heap: frozen while they run, thawed after, nested blocks kept frozen."""
from __future__ import annotations

import gc

from specscale.clock import WallClock
from specscale.engine.torch.profiler import measure
from specscale.frozen_heap import frozen_heap


def test_the_wall_clock_freezes_the_heap_it_finds_and_thaws_it_when_stopped():
    keep = [[i] for i in range(1000)]  # a setup heap
    clock = WallClock()
    clock.start()
    try:
        assert gc.get_freeze_count() >= len(keep)
    finally:
        clock.stop()
    assert gc.get_freeze_count() == 0


def test_a_block_inside_a_frozen_block_leaves_it_frozen():
    counts = []
    with frozen_heap():
        outer = gc.get_freeze_count()
        with frozen_heap():
            pass
        counts.append(gc.get_freeze_count())
    assert outer > 0 and counts == [outer] and gc.get_freeze_count() == 0


def test_the_micro_benchmarks_run_frozen_and_their_probe_between_rounds_too():
    seen = []
    point = ({"name": "a"}, lambda: seen.append(gc.get_freeze_count()) or 1.0)
    measure([point], reps=2, between=lambda: seen.append(gc.get_freeze_count()))
    assert len(seen) == 6 and all(n > 0 for n in seen) and gc.get_freeze_count() == 0
