"""Where one decode iteration of the torch engine goes, part by part.

``bench_torch_engine`` times whole runs and splits an iteration into the forward and the
rest. This goes further, in one extra run after the timed ones (an instrumented run is
never a timed one): a timer around every call of

* the linear layers (``torch.nn.functional.linear``: the projections, the MLP, the LM head),
* the attention backend (KV cache writes and attention),
* the hot ops (RMS norms with their residual adds, SiLU x up, rotary),
* the sampler's tensor math (``sampler.draw``: softmax, CDF, search; device work on a GPU),

summed per iteration; the rest of the forward (embedding, cos/sin rows, views, module
calls, batch building) and the rest of the step (scheduling, bookkeeping, step ends) are
what the timers do not cover. Each timer costs ~0.3 us, ~30 of them per iteration. The
timers read the host clock around each call: on the CPU that is the part's work; on a GPU
it would be the launches only (the work runs later, on the device), so the split is for
the CPU.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict
from typing import Callable, Iterator

import torch.nn.functional as F

PARTS = ("linear layers", "attention", "norms, SiLU x up, rotary", "sampler tensor math")


class CallTimer:
    """Seconds spent inside wrapped calls, per part, since the last ``take``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    def wrap(self, part: str, fn: Callable) -> Callable:
        totals = self.totals

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[part] += time.perf_counter() - t0

        return timed

    def take(self) -> dict[str, float]:
        out = {p: self.totals.get(p, 0.0) for p in PARTS}
        self.totals.clear()
        return out


@contextlib.contextmanager
def instrumented(backend) -> Iterator[CallTimer]:
    """Timers around the parts' calls of a ``TorchBackend`` (restored on exit)."""
    from dataclasses import replace

    from specscale.engine import sampler

    timer = CallTimer()
    runner = backend.runner
    body = runner.model.model
    attention, ops, linear, draw = runner.backend, body.hot_ops, F.linear, sampler.draw
    attention_forward = attention.forward
    try:
        F.linear = timer.wrap("linear layers", linear)
        attention.forward = timer.wrap("attention", attention_forward)
        part = "norms, SiLU x up, rotary"
        body.hot_ops = replace(ops, rms_norm=timer.wrap(part, ops.rms_norm),
                               add_rms_norm=timer.wrap(part, ops.add_rms_norm),
                               silu_mul=timer.wrap(part, ops.silu_mul), rotary=timer.wrap(part, ops.rotary))
        sampler.draw = timer.wrap("sampler tensor math", draw)
        yield timer
    finally:
        F.linear, sampler.draw, body.hot_ops = linear, draw, ops
        del attention.forward  # the instance attribute: the class's method serves again


def decode_split(backend, run: Callable[..., tuple[float, dict]]) -> dict[str, float]:
    """Median milliseconds per decode iteration of each part, the rest of the forward,
    the rest of the step, and the step, over one instrumented ``run(backend, step_hook=)``."""
    per_step: list[dict[str, float]] = []
    with instrumented(backend) as timer:
        def hook(step_s: float, forward_s: float) -> None:
            parts = timer.take()
            covered_fwd = parts["linear layers"] + parts["attention"] + parts["norms, SiLU x up, rotary"]
            parts["rest of the forward"] = forward_s - covered_fwd
            parts["rest of the step"] = step_s - forward_s - parts["sampler tensor math"]
            parts["step"] = step_s
            per_step.append(parts)

        timer.take()
        run(backend, step_hook=hook)
    decode = per_step[1:]  # the first decode iteration computes the prompts' last tokens
    return {k: 1e3 * statistics.median(s[k] for s in decode) for k in decode[0]}


def print_split(seqs: int, split: dict[str, float], iterations: int) -> None:
    print(f"\nwhere a decode iteration at batch {seqs} goes (an extra, instrumented run; median of {iterations}, ms):")
    for k in (*PARTS[:3], "rest of the forward", PARTS[3], "rest of the step", "step"):
        print(f"  {k:<30}{split[k]:>8.3f}")
