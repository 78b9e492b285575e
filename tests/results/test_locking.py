"""Concurrent sweeps on one store, interruptions (SIGKILL, SIGTERM) and their leftovers."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cfg_helpers import SMALL, compose_cfg
from specscale.results.lock import LOCK_NAME, CellBusy, CellLock
from specscale.cell_job import run_and_store
from specscale.results.store import cell_dir, ensure_writable
from specscale.settings import CellSpec

ROOT = Path(__file__).resolve().parents[2]


def attempts(cell: Path) -> list[dict]:
    path = cell / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def starts(cell: Path) -> int:
    return sum(a["status"] == "start" for a in attempts(cell))


def test_two_sweeps_on_one_store_run_each_cell_once(tmp_path):
    cmd = [sys.executable, "run.py", "-m", *SMALL, "wandb.mode=disabled", f"results_dir={tmp_path}",
           "policy=nonspec,full", "beam=4,8", "seed=0,1"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    cells = sorted(p.parent for p in tmp_path.rglob("summary.json"))
    assert len(cells) == 8
    assert [starts(c) for c in cells] == [1] * 8, "a cell ran in both sweeps"
    assert not list(tmp_path.rglob(LOCK_NAME))


def test_live_lock_is_busy_and_dead_or_silent_owners_are_taken_over(tmp_path):
    with CellLock(tmp_path):
        with pytest.raises(CellBusy, match=f"pid {os.getpid()}"):
            CellLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_NAME).exists()
    # Owner on this host whose process is gone (SIGKILL): taken over at once.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "token": "x"}))
    lock = CellLock(tmp_path).acquire()
    assert lock.took_over["pid"] == dead.pid and lock.owns()
    lock.release()
    # Owner on another node: taken over only once its heartbeat is old.
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node-elsewhere", "pid": 1, "token": "y"}))
    with pytest.raises(CellBusy, match="node-elsewhere"):
        CellLock(tmp_path, stale_after_s=60).acquire()
    old = time.time() - 120
    os.utime(tmp_path / LOCK_NAME, (old, old))
    lock = CellLock(tmp_path, stale_after_s=60).acquire()
    assert lock.took_over["host"] == "node-elsewhere"
    lock.release()


def _plant_stale_lock(directory: Path, flavor: int, dead_pid: int) -> None:
    directory.mkdir(parents=True)
    path = directory / LOCK_NAME
    old = time.time() - 3600
    if flavor == 0:  # owner on this host, process gone (SIGKILL)
        path.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid, "token": "dead"}))
    elif flavor == 1:  # owner on a node that went away: silent heartbeat
        path.write_text(json.dumps({"host": "node-gone", "pid": 1, "token": "gone"}))
    else:  # a writer killed between creating the lock and writing its record
        path.write_text("")
    os.utime(path, (old, old))


class _SlowFileSystem:
    """os and json for the lock module with random latency on renames and record writes (a
    busy shared file system): widens the windows in which two takers interleave."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def rename(src, dst):
        time.sleep(random.uniform(0, 0.003))
        os.rename(src, dst)

    @staticmethod
    def dump(record, fh):
        time.sleep(random.uniform(0, 0.003))
        json.dump(record, fh)

    loads = staticmethod(json.loads)


def _race_for_stale_locks(directories, barrier, results) -> None:
    from specscale.results import lock as lock_module

    lock_module.os = lock_module.json = _SlowFileSystem()  # in this forked process only
    random.seed(os.getpid())
    held = []
    for d in directories:
        barrier.wait()  # both processes go for the same stale lock at once
        try:
            held.append(CellLock(d).acquire())
            results.put((str(d), os.getpid(), held[-1].token))
        except CellBusy:
            results.put((str(d), os.getpid(), None))
    barrier.wait()  # hold every lock won until the other process has tried them all
    for lock in held:
        lock.release()


def test_two_processes_racing_for_a_stale_lock_take_it_over_once(tmp_path):
    import multiprocessing

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rounds = 150
    dirs = [tmp_path / f"cell{i}" for i in range(rounds)]
    for i, d in enumerate(dirs):
        _plant_stale_lock(d, i % 3, dead.pid)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race_for_stale_locks, args=(dirs, barrier, results)) for _ in range(2)]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=120) for _ in range(2 * rounds)]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for d in dirs:
        tries = [token for cell, _, token in got if cell == str(d)]
        winners = [t for t in tries if t is not None]
        assert len(tries) == 2 and len(winners) == 1, f"{d.name}: {len(winners)} processes took the stale lock"
    assert not list(tmp_path.rglob(".lock*")), "a lock, guard or set-aside file was left behind"


def test_takeover_guard_of_a_dead_taker_does_not_block_the_cell(tmp_path):
    from specscale.results.lock import GUARD_NAME

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _plant_stale_lock(tmp_path / "cell", 0, dead.pid)
    # A taker killed while holding the guard (between taking it and removing the lock).
    (tmp_path / "cell" / GUARD_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                                             "token": "taker"}))
    lock = CellLock(tmp_path / "cell").acquire()
    assert lock.took_over["token"] == "dead" and lock.owns()
    lock.release()
    assert not list((tmp_path / "cell").iterdir())


def test_heartbeat_keeps_the_lock_fresh(tmp_path):
    lock = CellLock(tmp_path, heartbeat_s=0.05).acquire()
    old = time.time() - 1000
    os.utime(lock.path, (old, old))
    time.sleep(0.3)
    assert time.time() - lock.path.stat().st_mtime < 5
    lock.release()


def _start_cell(tmp_path, *extra):
    # A cell long enough to be interrupted mid-run (a few seconds).
    common = [*SMALL, "wandb.mode=disabled", f"results_dir={tmp_path}", "n_problems=64", "beam=8",
              "concurrency=32", "search.max_rounds=40", "engine.synthetic.steps_median=12",
              "engine.synthetic.step_len_median=60", *extra]
    proc = subprocess.Popen([sys.executable, "run.py", *common], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.rglob("attempts.jsonl")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return proc, common


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_interrupted_cell_is_rerun_once(tmp_path, sig):
    proc, common = _start_cell(tmp_path)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    assert not list(tmp_path.rglob("summary.json")), "the cell finished before the signal: make it longer"
    cell = next(tmp_path.rglob("attempts.jsonl")).parent
    assert proc.returncode != 0
    if sig == signal.SIGTERM:  # handled like Ctrl-C: recorded, lock released, the run stops
        err = json.loads((cell / "error.json").read_text())
        assert err["status"] == "interrupted" and err["error_type"] == "Terminated", out[-2000:]
        assert not (cell / LOCK_NAME).exists()
    else:  # SIGKILL: nothing can run; the lock of a dead PID is taken over by the rerun
        assert (cell / LOCK_NAME).exists()
    subprocess.run([sys.executable, "run.py", *common], cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert (cell / "summary.json").exists() and not (cell / "error.json").exists()
    assert starts(cell) == 2 and not (cell / LOCK_NAME).exists()
    assert list(tmp_path.rglob("summary.json")) == [cell / "summary.json"] and not list(tmp_path.rglob("*.tmp"))
    if sig == signal.SIGKILL:
        assert attempts(cell)[-2]["took_over"]["pid"] == proc.pid


def test_temp_file_of_a_write_killed_midway_is_cleaned_on_rerun(tmp_path):
    cfg = compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled")
    cell = cell_dir(CellSpec.from_config(cfg))
    # A real atomic_write killed while writing (SIGKILL: no cleanup runs).
    writer = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from specscale.metrics.writer import atomic_write\n"
        "def slow(tmp):\n"
        "    open(tmp, 'w').write('half')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        f"atomic_write(Path({str(cell)!r}) / 'summary.json', slow)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait()
    assert len(list(cell.glob(".summary.json.*.tmp"))) == 1 and not (cell / "summary.json").exists()
    assert run_and_store(cfg)["status"] == "done"
    assert not list(cell.glob("*.tmp")) and not list(tmp_path.rglob(".*.tmp"))


def test_write_probes_of_parallel_processes_do_not_collide(tmp_path):
    probe = ("import sys\nfrom specscale.results.store import ensure_writable\n"
             f"for _ in range(1500): ensure_writable({str(tmp_path)!r})\n")
    procs = [subprocess.Popen([sys.executable, "-c", probe], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    ensure_writable(tmp_path)
    assert not list(tmp_path.iterdir())


def test_finished_read_only_store_skips_its_done_cells(tmp_path):
    cfg = compose_cfg(f"results_dir={tmp_path}", "wandb.mode=disabled")
    assert run_and_store(cfg)["status"] == "done"
    modes = []
    for p in [tmp_path, *tmp_path.rglob("*")]:
        if p.is_dir():
            modes.append((p, p.stat().st_mode))
            p.chmod(0o555)
    try:
        if os.access(tmp_path, os.W_OK):
            pytest.skip("running as a user that can write to read-only directories (root)")
        assert run_and_store(cfg)["status"] == "skipped"
    finally:
        for p, mode in modes:
            p.chmod(mode)
