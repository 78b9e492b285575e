"""The Server's clocks: what "now" and the makespan mean on each backend (DESIGN §6).

* ``WallClock`` (torch): the wall-clock time of the whole serving loop, from a device
  synchronisation at ``start`` to one at ``stop`` (once per run), so host work
  (scheduling, sampling bookkeeping, PRM input building, the search itself) is on it.
  Device calls are timed separately by the backend (generation / verification, with
  CUDA events, never a synchronisation of their own); what is left is "other". Gaps
  with nothing to do until the next arrival (Poisson workloads) are skipped, not slept:
  they are added to the clock and reported as idle.
* ``VirtualClock`` (sim): every duration is modelled; the backend's device seconds
  advance it, and host work is charged from modelled constants per generation
  iteration and per PRM task (``HostCostModel``), reported as "other".

The Server only calls ``device``, ``host_*`` and ``skip``; a wall clock ignores the
modelled charges, because the real ones already happened.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class HostCostModel:
    """Modelled host seconds (sim only; MODEL constants, see conf/engine/sim.yaml)."""

    iteration_s: float = 0.0  # scheduling + sampling bookkeeping per generation iteration
    prm_task_s: float = 0.0  # PRM input building (tokenization) per PRM task

    def __post_init__(self) -> None:
        if min(self.iteration_s, self.prm_task_s) < 0:
            raise ValueError("host costs must be non-negative")


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

    def host_iteration(self) -> float:
        self.t += self.host.iteration_s
        return self.host.iteration_s

    def host_prm_tasks(self, n: int) -> float:
        s = self.host.prm_task_s * n
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

    def host_iteration(self) -> float:
        return 0.0

    def host_prm_tasks(self, n: int) -> float:
        return 0.0

    def skip(self, seconds: float) -> None:
        self._skipped += seconds

    def stop(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        self._stopped = self.now()
        return self._stopped
