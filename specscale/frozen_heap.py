"""A timed loop runs with the heap it found frozen, as serving engines run theirs.

CPython's oldest-generation garbage collection scans every tracked object alive, so its
pauses grow with the process's heap: in a profiling or fidelity process that has built
engines, tables and trees, one pause measured 337 ms (500,000 objects), several times a
short serving cell's whole makespan, and it lands inside whichever timed call happens to
allocate then. A serving engine pays no such pauses for its setup heap: vLLM freezes the
heap (``gc.freeze``) once its model is loaded and warmed up. So the torch engine's wall
clock (``specscale.clock.WallClock``) and the profiler's micro-benchmarks
(``specscale.engine.torch.profiler.measure``) freeze what is alive when they start: the
collector then scans only what the timed loop itself allocates, and that garbage is still
collected and its cost still measured. The heap is thawed when the loop ends, so a process
that builds many engines (a sweep, the profiler, the fidelity check) still frees the cyclic
garbage of the engines it has dropped. No collection runs first (vLLM collects once, as it
freezes once): freezing and thawing are constant-time, and garbage alive at the start
waits for the thaw, so a run's setup stays off the clock and costs nothing.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


def freeze_heap() -> None:
    """Move every object alive to the collector's permanent generation (what a loop that
    raised left frozen is thawed first, and frozen again with the rest)."""
    gc.unfreeze()
    gc.freeze()


def thaw_heap() -> None:
    """Hand the frozen objects back to the collector (its oldest generation)."""
    gc.unfreeze()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Frozen for the block; inside a frozen block already (the profiler's speed probe
    between its rounds), left as it is, so the outer block stays frozen."""
    if gc.get_freeze_count():
        yield
        return
    freeze_heap()
    try:
        yield
    finally:
        thaw_heap()
