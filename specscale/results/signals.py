"""SIGTERM handled like SIGINT while a cell runs.

SLURM sends SIGTERM on timeout, scancel and preemption (then SIGKILL after KillWait);
a plain SIGTERM kills Python without running ``finally`` blocks, so the cell lock and
the interruption record would be left to the next run to clean up. Raising
``Terminated`` (a KeyboardInterrupt) instead unwinds exactly as Ctrl-C does.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Install the handler for the duration of the block, only where nobody else handles
    SIGTERM (submitit installs its own to requeue preempted jobs; that one is kept) and
    only in the main thread (the only one Python delivers signals to)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL, None,
    ):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
