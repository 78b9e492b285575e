"""The Server's clocks: what "now" and the makespan mean on each backend (docs/design.md §6).

* ``WallClock`` (torch): the wall-clock time of the whole serving loop, from a device
  synchronisation at ``start`` to one at ``stop`` (once per run), so host work
  (scheduling, sampling bookkeeping, PRM input building, the search itself) is on it.
  Device calls are timed separately by the backend (generation / verification, with
  CUDA events, never a synchronisation of their own); what is left is "other". Gaps
  with nothing to do until the next arrival (Poisson workloads) are skipped, not slept:
  they are added to the clock and reported as idle.
* ``VirtualClock`` (sim): every duration is modelled; the backend's device seconds
  advance it, and host work is charged per generation iteration and per PRM batch
  (``HostCostModel``: modelled constants, or terms fitted to a measured profile), reported
  as "other".

The Server only calls ``device``, ``host_*`` and ``skip``; a wall clock ignores the
modelled charges, because the real ones already happened.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Callable, Optional, Sequence

from specscale.frozen_heap import freeze_heap, thaw_heap


@dataclass(frozen=True)
class HostCostModel:
    """Modelled host seconds (sim only), charged to "other" on the virtual clock.

    The roofline sim uses two MODEL constants (conf/engine/sim.yaml: per generation
    iteration and per PRM task). A measured profile (``runners.profile_engine``) fits all
    terms to the wall-clock gaps between device calls of real runs, because host work
    grows with what an iteration did: rows scheduled and sampled, steps that ended (each
    wakes the search), forks made; and a PRM batch's with its tasks and tokens.
    """

    iteration_s: float = 0.0  # per generation iteration: scheduling, the serving loop
    prm_task_s: float = 0.0  # per PRM task: input building (tokenization), scores back to the search
    decode_row_s: float = 0.0  # per decode row of an iteration (batch building, bookkeeping)
    prefill_token_s: float = 0.0  # per prefill token of an iteration
    draw_s: float = 0.0  # per logical draw (sampling bookkeeping, token appends)
    step_end_s: float = 0.0  # per finished step (queued for verification, the search woken)
    fork_s: float = 0.0  # per fork (a new physical sequence sharing blocks)
    prm_batch_s: float = 0.0  # per PRM batch
    prm_token_s: float = 0.0  # per computed PRM input token

    def __post_init__(self) -> None:
        bad = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) < 0}
        if bad:
            raise ValueError(f"host costs must be non-negative, got {bad}")

    @cached_property
    def _per_item(self) -> bool:
        """Whether any term depends on what an iteration did (the roofline's two constants
        do not: then its hot path reads nothing from the StepResult)."""
        return any((self.decode_row_s, self.prefill_token_s, self.draw_s, self.step_end_s, self.fork_s))

    def iteration(self, res: Any = None) -> float:
        """Seconds of host work around one generation iteration (``res``: its StepResult)."""
        s = self.iteration_s
        if res is not None and self._per_item:
            s += (self.decode_row_s * res.decode_rows + self.prefill_token_s * res.prefill_tokens
                  + self.draw_s * res.draws + self.step_end_s * sum(len(g) for _, g in res.finished)
                  + self.fork_s * res.forks)
        return s

    def prm_batch(self, n_tasks: int, items: Sequence[Any] = ()) -> float:
        """Seconds of host work around one PRM batch of ``n_tasks`` tasks; ``items``: its
        planned ScoreItems, whose computed tokens (``n_new``) are counted only when priced."""
        tokens = sum(it.n_new for it in items) if self.prm_token_s else 0
        return self.prm_batch_s + self.prm_task_s * n_tasks + self.prm_token_s * tokens


@dataclass
class VirtualClock:
    host: HostCostModel = field(default_factory=HostCostModel)
    t: float = 0.0

    def start(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def device(self, seconds: float) -> None:
        self.t += seconds

    def host_iteration(self, res: Any = None) -> float:
        s = self.host.iteration(res)
        self.t += s
        return s

    def host_prm_tasks(self, n: int, items: Sequence[Any] = ()) -> float:
        s = self.host.prm_batch(n, items)
        self.t += s
        return s

    def skip(self, seconds: float) -> None:
        self.t += seconds

    def stop(self) -> float:
        return self.t


@dataclass
class WallClock:
    synchronize: Optional[Callable[[], None]] = None  # device sync at start and stop (once per run)
    _t0: float = 0.0
    _skipped: float = 0.0
    _stopped: Optional[float] = None

    def start(self) -> None:
        freeze_heap()  # the setup heap out of the collector's scans while the loop runs (frozen_heap.py)
        if self.synchronize is not None:
            self.synchronize()
        self._skipped, self._stopped = 0.0, None
        self._t0 = time.perf_counter()

    def now(self) -> float:
        # No sync here: when GenerationEngine.step() or Backend.score() returns, the device
        # work it queued has finished (the iteration's one wait for the device, the
        # sampler's token-id copy or the PRM's reward copy, or else the resolve of the
        # call's timing events, came after it), so between calls there is no queued device
        # work that the host could outrun.
        return time.perf_counter() - self._t0 + self._skipped

    def device(self, seconds: float) -> None:
        """Already elapsed on the wall clock."""

    def host_iteration(self, res: Any = None) -> float:
        return 0.0

    def host_prm_tasks(self, n: int, items: Sequence[Any] = ()) -> float:
        return 0.0

    def skip(self, seconds: float) -> None:
        self._skipped += seconds

    def stop(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        self._stopped = self.now()
        thaw_heap()
        return self._stopped
