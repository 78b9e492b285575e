"""The time guard: signal path on the main thread, child process elsewhere."""

import threading
import time

import pytest

from specscale.grading import answers_equivalent
from specscale.grading.deadline import DeadlineExceeded, run_with_deadline


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def _swallowing_spin(seconds: float) -> str:
    # Library code often catches Exception; the guard must still get out.
    try:
        return _spin(seconds)
    except Exception:
        return "swallowed"


def test_returns_value_within_deadline():
    assert run_with_deadline(_spin, (0.01,), timeout_s=2.0) == "done"


@pytest.mark.parametrize("fn", [_spin, _swallowing_spin])
def test_main_thread_deadline(fn):
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        run_with_deadline(fn, (10.0,), timeout_s=0.2)
    assert time.monotonic() - started < 2.0


def test_none_timeout_disables_the_guard():
    assert run_with_deadline(_spin, (0.01,), timeout_s=None) == "done"


def test_bad_timeout_is_rejected():
    with pytest.raises(ValueError):
        run_with_deadline(_spin, (0.01,), timeout_s=0)


def test_worker_thread_uses_a_child_process():
    results = {}

    def work():
        try:
            run_with_deadline(_spin, (10.0,), timeout_s=0.3)
        except DeadlineExceeded:
            results["timed_out"] = True
        results["value"] = run_with_deadline(_spin, (0.01,), timeout_s=5.0)
        results["pathological"] = answers_equivalent("9^{9^{9^{9}}}", "3", timeout_s=0.3)
        results["easy"] = answers_equivalent("1/2", "0.5")

    started = time.monotonic()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert results == {"timed_out": True, "value": "done", "pathological": False, "easy": True}
    assert time.monotonic() - started < 15.0


def test_nested_guard_keeps_the_outer_deadline():
    def outer():
        assert run_with_deadline(_spin, (0.01,), timeout_s=5.0) == "done"
        return _spin(10.0)  # the outer deadline must still be armed here

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        run_with_deadline(outer, (), timeout_s=0.3)
    assert time.monotonic() - started < 2.0
