"""A wall-clock guard around calls that may not terminate in reasonable time.

math_verify hands its inputs to sympy, and some answers (exponent towers, huge
factorials) make a comparison run for minutes. math_verify has its own timeouts,
but they are whole seconds per operation and use ``signal.alarm``, which would
cancel any outer guard; so the grader switches them off and wraps the complete
parse+verify in one deadline from here instead.

- Main thread on POSIX: ``signal.setitimer`` (sub-second resolution, no process).
  The alarm raises ``DeadlineExceeded``, a ``BaseException``, because library code
  that catches ``Exception`` (math_verify does, then returns a default) must not
  swallow it and keep computing without a clock.
- Elsewhere (worker threads, no SIGALRM): signals are unusable, so the call runs
  in a child process that is killed at the deadline. This costs a fork per call,
  and ``fn``, its arguments and its result must be picklable.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """The guarded call ran past its deadline (raised in the caller)."""


def run_with_deadline(fn: Callable[..., T], args: tuple = (), timeout_s: float | None = 5.0) -> T:
    """Return ``fn(*args)``, or raise ``DeadlineExceeded`` after ``timeout_s`` seconds.

    ``timeout_s=None`` runs without a guard (the caller takes the risk).
    """
    if timeout_s is None:
        return fn(*args)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive or None, got {timeout_s!r}")
    if _signals_usable():
        return _run_with_alarm(fn, args, float(timeout_s))
    return _run_in_child(fn, args, float(timeout_s))


def _signals_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _raise_deadline(signum: int, frame: Any) -> None:
    raise DeadlineExceeded()


def _run_with_alarm(fn: Callable[..., T], args: tuple, timeout_s: float) -> T:
    previous_handler = signal.signal(signal.SIGALRM, _raise_deadline)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    started = time.monotonic()
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_delay > 0:
            # Someone else's timer was pending: give it back what is left of it
            # (it fires late by at most our own timeout if ours was longer).
            remaining = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-6), outer_interval)


def _child_main(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException as exc:  # report anything, the parent decides
        try:
            conn.send((False, exc))
        except Exception:
            conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def _run_in_child(fn: Callable[..., T], args: tuple, timeout_s: float) -> T:
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(sender, fn, args), daemon=True)
    child.start()
    sender.close()
    answered = False
    try:
        if not receiver.poll(timeout_s):
            raise DeadlineExceeded()
        ok, value = receiver.recv()
        answered = True
    except EOFError as exc:  # the child died without answering
        raise RuntimeError("guarded call died in its child process") from exc
    finally:
        # An answered child is only exiting: let it. Otherwise it is stuck: kill it.
        child.join(timeout=1.0 if answered else 0)
        if child.is_alive():
            child.kill()
            child.join()
        receiver.close()
    if ok:
        return value
    raise value
