"""Timing a device call without synchronising inside it (one sync per engine iteration).

A CUDA kernel launch returns before the kernel runs, so "how long did this forward take"
has two honest answers: synchronise before and after it and read the host clock (two
host-device round trips per call, and the host idles while the device drains its queue),
or record CUDA events around it on the stream and read their elapsed time once the
device has reached the second one. The engine does the second: the caller already waits
for the device once per iteration (the sampler's copy of the drawn token ids, the PRM's
copy of its rewards), and resolving the interval after that wait costs nothing. Only
when nothing else waited (a prefill-only iteration) does resolving wait on the end
event itself, and that wait is then the iteration's one synchronisation.

What the interval covers (docs/design.md §6, the honest clock): the start event is recorded when
the host starts the call and executes when the stream reaches it. Between engine calls
the stream is idle (every step/score returns after the device finished its work), so
that is the moment the host starts; the host work inside the call (batch building,
attention plans, kernel launches) is therefore inside the interval, exactly as with a
synchronised ``perf_counter`` pair. If earlier work were still queued, the start event
would execute only after it: that earlier work is then correctly *not* counted to this
call. The end event executes when the device has finished everything the call queued
(or when the host recorded it, if the device was already idle): the interval ends when
both host and device are done with the call.

On the CPU (and any non-CUDA device, whose torch ops run synchronously here) the call
is timed with ``time.perf_counter`` and the seconds are a plain float.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from specscale.engine.backend import Seconds

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceInterval:
    """A CUDA call's duration, read lazily from its two timing events (``resolve``).

    Resolve it after the caller's own device->host read of the call's results: the end
    event was recorded before that read was queued, so it has completed and resolving
    does not wait. ``resolve_seconds`` (backend.py) accepts this or a plain float."""

    start: torch.cuda.Event
    end: torch.cuda.Event

    def done(self) -> bool:
        """Whether the device has finished the call (never waits)."""
        return self.end.query()

    def resolve(self) -> float:
        """Seconds from the start to the end event; waits for the end event only if the
        device has not reached it yet (``query`` first: an Event.synchronize on a completed
        event is cheap but still a driver call the sync counters would see)."""
        if not self.end.query():
            self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


@dataclass(frozen=True)
class DeviceTimer:
    """Times device calls on one device: CUDA events there, ``perf_counter`` elsewhere."""

    device: torch.device

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))

    @property
    def uses_events(self) -> bool:
        return self.device.type == "cuda"

    def time(self, work: Callable[[], T]) -> tuple[T, Seconds]:
        """``work()`` and its duration: a ``DeviceInterval`` on CUDA (nothing waits here), a
        float in seconds elsewhere."""
        if not self.uses_events:
            t0 = time.perf_counter()
            out = work()
            return out, time.perf_counter() - t0
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = work()
        end.record(stream)
        return out, DeviceInterval(start, end)
