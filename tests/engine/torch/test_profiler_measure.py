"""The profiler's interleaved timing: every point once per round, and the hook between
rounds that samples the machine's speed across the whole table."""
from __future__ import annotations

from specscale.engine.torch.profiler import measure


def test_rounds_interleave_points_and_the_hook_runs_between_them():
    log: list[str] = []

    def point(name: str, seconds: float):
        def fn() -> float:
            log.append(name)
            return seconds
        return {"name": name}, fn

    table = measure([point("a", 1.0), point("b", 2.0)], reps=3, between=lambda: log.append("|"))
    # One warm-up call per point, then the hook before each round and after the last one.
    assert log == ["a", "b", "|", "a", "b", "|", "a", "b", "|", "a", "b", "|"]
    assert list(table["name"]) == ["a", "b"] and list(table["median_s"]) == [1.0, 2.0]
    assert (table["reps"] == 3).all()
    log.clear()
    measure([point("a", 1.0)], reps=2)  # no hook: rounds only
    assert log == ["a", "a", "a"]
