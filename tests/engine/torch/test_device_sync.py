"""At most one wait for the device per engine iteration, none inside a forward: device
calls are timed with CUDA events resolved after the iteration's own read of
its results (the sampler's token-id copy, the PRM's reward copy), or on the end event when
nothing else waited (device_timer.py).

On the CPU: the serving loop calls ``ModelRunner.synchronize`` only in the clock's
``start`` and ``stop``; the generation engine resolves its seconds after the draw, once per
step; every recorded duration is a positive float. On CUDA (skipped here): synchronising
calls counted per generation iteration and per PRM batch, the explicit ones
(``torch.cuda.synchronize``, ``Event.synchronize``) and the implicit ones torch's sync debug
mode reports (``.cpu()``, ``.tolist()``, blocking copies); event-timed seconds against a
synchronised ``perf_counter`` measurement.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import pytest
import torch

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.engine import generation
from specscale.engine.backend import resolve_seconds
from specscale.engine.torch.runtime.device_timer import DeviceTimer
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.clock import WallClock

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (event timing, sync counts)")

TORCH = [
    "engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float32", "progress=false",
    "n_problems=2", "search.temperature=1.0", "search.max_rounds=4", "search.step_token_cap=12",
    "search.path_token_cap=48", "wandb.mode=disabled", "beam=4", "expansion=2", "concurrency=2", "seed=2",
    "policy=full",  # speculation and the PRM cache's head waves: several forwards per PRM batch
]
SIM = ["engine=sim", "n_problems=2", "concurrency=2", "progress=false", "wandb.mode=disabled", "policy=full"]

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny ops, one thread


# ---------------------------------------------------------------- CPU
def test_cpu_timer_returns_the_wall_time_as_a_float():
    timer = DeviceTimer(torch.device("cpu"))
    assert not timer.uses_events
    out, seconds = timer.time(lambda: time.sleep(0.02) or 7)
    assert out == 7 and type(seconds) is float and 0.02 <= seconds < 1.0
    assert resolve_seconds(seconds) is seconds  # a float passes unchanged
    assert resolve_seconds(3) == 3.0 and type(resolve_seconds(3)) is float


def test_serving_loop_synchronises_only_in_the_clock(monkeypatch):
    """Between WallClock.start and stop nothing calls ModelRunner.synchronize (a timed call
    that synchronised around its work, as the engine once did, would call it twice per forward
    and per PRM batch). Allowed: one call inside start, one inside stop."""
    log: list[str] = []
    sync, start, stop = ModelRunner.synchronize, WallClock.start, WallClock.stop

    def counted_sync(self):
        log.append("sync")
        return sync(self)

    def logged(name, method):
        def run(self):
            log.append(f"{name}(")
            out = method(self)
            log.append(f"){name}")
            return out
        return run

    # Patched before the build: the clock holds the runner's (patched) bound method.
    monkeypatch.setattr(ModelRunner, "synchronize", counted_sync)
    monkeypatch.setattr(WallClock, "start", logged("start", start))
    monkeypatch.setattr(WallClock, "stop", logged("stop", stop))
    server = build_server(compose_cfg(*TORCH, small=False))
    steps, scores = _count_calls(server)
    rec = server.run()
    assert steps["n"] > 10 and scores["n"] > 3  # the loop really served
    assert log.count("start(") == 1 and log.count("stop(") == 1
    serving = log[log.index(")start"): log.index("stop(")]
    assert serving.count("sync") == 0, "a device synchronisation inside the serving loop"
    assert log[log.index("start("): log.index(")start")].count("sync") == 1
    assert log[log.index("stop("): log.index(")stop")].count("sync") == 1
    _assert_float_seconds(rec)


def _count_calls(server) -> tuple[dict, dict]:
    steps, scores = {"n": 0}, {"n": 0}
    step, score = server.gen.step, server.backend.score

    def counted_step():
        steps["n"] += 1
        return step()

    def counted_score(items):
        scores["n"] += 1
        return score(items)

    server.gen.step = counted_step
    server.backend.score = counted_score
    return steps, scores


def _assert_float_seconds(rec) -> None:
    kinds = {it["kind"] for it in rec.iterations}
    assert kinds == {"generate", "verify"}
    for it in rec.iterations:
        assert type(it["seconds"]) is float and it["seconds"] > 0, it
    for b in rec.verify_batches:
        assert type(b["seconds"]) is float and b["seconds"] > 0, b


@dataclass
class PendingStub:
    """Stands in for a CUDA DeviceInterval: records when the engine resolves it."""

    value: float
    log: list = field(default_factory=list)

    def resolve(self) -> float:
        self.log.append("resolve")
        return self.value


def test_step_resolves_seconds_after_the_draw_once(monkeypatch):
    """GenerationEngine.step resolves the forward's pending seconds exactly once, after the
    sampler's read of the drawn tokens (the read that waits for the device on CUDA), and
    hands a float on."""
    log: list[str] = []
    sample = generation.sample_rows

    def logged_sample(*a, **k):
        log.append("draw")
        return sample(*a, **k)

    monkeypatch.setattr(generation, "sample_rows", logged_sample)
    server = build_server(compose_cfg(*SIM))
    forward = server.gen.backend.forward
    pending: list[PendingStub] = []

    def pending_forward(batch):
        logits, seconds = forward(batch)
        log.append("forward")
        pending.append(PendingStub(float(seconds), log))
        return logits, pending[-1]

    server.gen.backend.forward = pending_forward
    step = server.gen.step
    results = []

    def checked_step():
        del log[:]
        res = step()
        # forward, then the draw (if any row drew), then one resolve: nothing after it.
        want = ["forward", "draw", "resolve"] if res.logit_rows else ["forward", "resolve"]
        assert log == want
        assert type(res.seconds) is float and res.seconds == pending[-1].value
        results.append(res)
        return res

    server.gen.step = checked_step
    rec = server.run()
    assert len(results) > 10 and any(r.logit_rows == 0 for r in results)  # prompt prefills are logit-free
    assert [it["seconds"] for it in rec.iterations if it["kind"] == "generate"] == [p.value for p in pending]


def test_pending_seconds_keep_the_tree():
    """The sim's tree is the same whether its seconds come as floats or pending (resolved
    by the engine): the clock sees the same numbers."""
    ref = build_server(compose_cfg(*SIM)).run()
    server = build_server(compose_cfg(*SIM))
    forward = server.gen.backend.forward

    def pending_forward(batch):
        logits, seconds = forward(batch)
        return logits, PendingStub(seconds)

    server.gen.backend.forward = pending_forward
    rec = server.run()
    assert rec.iterations == ref.iterations


# ---------------------------------------------------------------- CUDA
@dataclass
class SyncCounter:
    """Synchronising calls: explicit ones (torch.cuda.synchronize, Event.synchronize),
    counted by wrappers, and implicit ones (a blocking device->host copy: .cpu(), .tolist(),
    .item(); Stream.synchronize), reported by torch's sync debug mode while ``count`` runs."""

    explicit: int = 0

    def install(self, monkeypatch) -> None:
        real_sync, real_event_sync = torch.cuda.synchronize, torch.cuda.Event.synchronize

        def quiet(fn):  # an explicit sync counted once, never also as an implicit one
            prev = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(0)
            try:
                return fn()
            finally:
                torch.cuda.set_sync_debug_mode(prev)

        def sync(*a, **k):
            self.explicit += 1
            return quiet(lambda: real_sync(*a, **k))

        def event_sync(ev):
            self.explicit += 1
            return quiet(lambda: real_event_sync(ev))

        monkeypatch.setattr(torch.cuda, "synchronize", sync)
        monkeypatch.setattr(torch.cuda.Event, "synchronize", event_sync)

    def count(self, fn):
        """(fn(), explicit syncs, implicit syncs) made by it. Implicit ones made inside a
        nested ``count`` are that call's, not this one's."""
        before = self.explicit
        prev = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
        implicit = sum("synchronizing CUDA operation" in str(w.message) for w in caught)
        return out, self.explicit - before, implicit


CUDA_CELL = ["engine.device=cuda", "engine.attention=torch", "engine.debug_checks=false",
             "engine.kv_blocks=1024", "engine.prm_kv_blocks=512", "engine.max_num_seqs=16"]


@needs_cuda
@pytest.mark.parametrize("mode", ["real", "synthetic"])
def test_cuda_one_sync_per_iteration_and_per_prm_batch(monkeypatch, mode):
    extra = ["engine.synthetic_tokens=true"] if mode == "synthetic" else []
    server = build_server(compose_cfg(*TORCH, *CUDA_CELL, *extra, small=False))
    runner = server.gen.backend.runner
    assert runner.device.type == "cuda"
    counter = SyncCounter()
    counter.install(monkeypatch)
    per_step, per_score = [], []  # (explicit, implicit) per call
    step, score = server.gen.step, server.backend.score
    stream = torch.cuda.current_stream(runner.device)

    def counted_step():
        res, e, i = counter.count(step)
        per_step.append((e, i))
        # The clock's invariant: the step's device work has finished (query never waits).
        assert stream.query(), "step() returned with device work still queued"
        return res

    def counted_score(items):
        out, e, i = counter.count(lambda: score(items))
        per_score.append((e, i))
        assert stream.query(), "score() returned with device work still queued"
        return out

    server.gen.step = counted_step
    server.backend.score = counted_score
    rec, explicit_all, implicit_outside = counter.count(server.run)
    assert len(per_step) > 10 and len(per_score) > 3
    graphs = runner.graphs
    lazy = graphs.lazy_captures if graphs is not None else None
    assert max(e + i for e, i in per_step) <= 1, f"syncs per generation iteration: {per_step} (lazy captures: {lazy})"
    assert max(e + i for e, i in per_score) <= 1, f"syncs per PRM batch: {per_score}"
    # Nothing else in the serving loop waits for the device but the clock's start and stop.
    outside = explicit_all - sum(e for e, _ in per_step + per_score) + implicit_outside
    assert outside <= 2, f"{outside} synchronisations outside step() and score()"
    _assert_float_seconds(rec)


@needs_cuda
def test_cuda_timer_does_not_wait_and_resolves_lazily():
    timer = DeviceTimer(torch.device("cuda"))
    cycles = _cycles_for(0.05)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    _, interval = timer.time(lambda: torch.cuda._sleep(cycles))
    launched = time.perf_counter() - t0
    assert launched < 0.025, "timing the call waited for the device"
    assert not interval.done()  # the device is still sleeping
    seconds = interval.resolve()
    assert interval.done() and 0.025 < seconds < 0.5
    assert resolve_seconds(interval) == seconds  # resolving again reads the same events


@needs_cuda
def test_cuda_interval_holds_host_time_not_earlier_queued_work():
    """The honest-clock meaning: host work inside the call is in its interval (the start
    event ran when the host started: the stream was idle); device work queued before the
    call is not (the start event waited behind it)."""
    timer = DeviceTimer(torch.device("cuda"))
    torch.cuda.synchronize()
    _, host_heavy = timer.time(lambda: time.sleep(0.05))
    assert host_heavy.resolve() >= 0.045
    torch.cuda.synchronize()
    torch.cuda._sleep(_cycles_for(0.1))  # queued before the call
    _, after_queue = timer.time(lambda: torch.ones(8, device="cuda").sum())
    assert after_queue.resolve() < 0.03


@needs_cuda
def test_cuda_event_seconds_agree_with_a_synchronised_wall_clock():
    from specscale.engine.torch.attention.batch import BatchRow
    from specscale.engine.torch.model_config import ModelConfig
    from specscale.engine.torch.model.configs import config_for, reduced

    cfg = ModelConfig.from_dict(reduced(config_for("Qwen/Qwen2.5-7B-Instruct"), hidden=1024, heads=8, layers=4,
                                        vocab=4096, intermediate=4096))
    runner = ModelRunner(None, config=cfg, load_format="random", num_blocks=512, dtype=torch.float32,
                         device="cuda", seed=0)
    rows = [BatchRow([(7 * i + j) % cfg.vocab_size for j in range(512)], 0, list(range(32 * i, 32 * i + 32)))
            for i in range(8)]  # 4096 prefill tokens: milliseconds of device work

    def work():
        batch = runner.make_batch(rows)
        return runner.compute_logits(runner.forward(batch), batch)

    def events() -> float:
        return resolve_seconds(runner.timed(work)[1])

    def wall() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(2):
        events(), wall()  # warm-up: allocator, kernels
    ev = sorted(events() for _ in range(5))[2]
    wl = sorted(wall() for _ in range(5))[2]
    assert ev > 0 and wl > 0
    assert 0.5 * wl - 1e-3 <= ev <= 1.5 * wl + 1e-3, (ev, wl)


def _cycles_for(seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``seconds``, measured with
    events after a warm-up (context creation and the kernel's first load are not in it)."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    probe = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    per_cycle = start.elapsed_time(end) / 1e3 / probe
    return max(1, int(seconds / per_cycle))
