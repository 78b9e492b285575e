"""Stored benchmark baselines: ``results/bench/<benchmark>.json``.

A benchmark compares what it measures now with figures stored by an earlier run, never with
code loaded out of git (a file move would break that, and the old code would run against
today's package). A stored baseline says where its figures came from: the command, the
commit, the machine, the date and the settings that shape the figures, so a table printed
against it can say when the comparison is not like with like (another machine, other sizes).

Figures are ``{row: {quantity: {"value": number, "unit": text}}}``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from specscale.metrics.writer import atomic_write
from specscale.results.provenance import cpu_model, git_state

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / "results" / "bench"
PROBE_TOLERANCE = 0.10  # the probe's best-of-N spread on an idle machine is a few percent


@dataclass(frozen=True)
class Machine:
    """What a figure depends on besides the code: the CPU, how many cores, the libraries,
    and one fixed matmul's time (catches a slower instance of the same CPU model)."""

    cpu: str
    cores: int
    torch: str
    python: str
    probe_ms: float | None = None

    @classmethod
    def here(cls, probe: bool = True) -> "Machine":
        return cls(cpu=cpu_model(), cores=core_count(), torch=torch.__version__, python=platform.python_version(),
                   probe_ms=speed_probe_ms() if probe else None)

    def describe(self) -> str:
        probe = f", probe {self.probe_ms:.3f} ms" if self.probe_ms is not None else ""
        return f"{self.cpu}, {self.cores} cores, torch {self.torch}, python {self.python}{probe}"


@dataclass
class Baseline:
    benchmark: str
    command: str
    commit: str
    date: str
    machine: Machine
    figures: dict[str, dict[str, dict]]
    settings: dict = field(default_factory=dict)
    note: str = ""

    def value(self, row: str, quantity: str) -> float | None:
        return self.figures.get(row, {}).get(quantity, {}).get("value")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> "Baseline":
        return cls(**{**d, "machine": Machine(**d["machine"])})


# ---------------------------------------------------------------- the machine
def core_count() -> int:
    # The cores this process may use (a container or taskset may allow fewer than the host has)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def speed_probe_ms(size: int = 256, repeat: int = 20) -> float:
    """Best time of a fixed float32 [size, size] matmul on one torch thread (~50 ms in all)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return 1e3 * best


def machine_warning(stored: Machine, here: Machine, tolerance: float = PROBE_TOLERANCE) -> str | None:
    """Why figures measured on ``stored`` do not compare with ours, or None when they do."""
    reasons = []
    if stored.cpu != here.cpu:
        reasons.append(f"CPU {stored.cpu!r} there, {here.cpu!r} here")
    if stored.cores != here.cores:
        reasons.append(f"{stored.cores} cores there, {here.cores} here")
    if stored.probe_ms and here.probe_ms and abs(here.probe_ms / stored.probe_ms - 1) > tolerance:
        reasons.append(f"speed probe {stored.probe_ms:.3f} ms there, {here.probe_ms:.3f} ms here")
    if not reasons:
        return None
    return ("WARNING: the baseline was measured on another machine (" + "; ".join(reasons)
            + "): ratios are not like with like")


def settings_warning(stored: dict, here: dict) -> str | None:
    """The settings that shape the figures (sizes, threads, repeats) when they differ."""
    diff = [f"{k} {stored.get(k)!r} there, {here.get(k)!r} here" for k in sorted(set(stored) | set(here))
            if stored.get(k) != here.get(k)]
    return "WARNING: the baseline ran other settings (" + "; ".join(diff) + ")" if diff else None


# ---------------------------------------------------------------- reading and writing
def baseline_path(benchmark: str, directory: Path = DEFAULT_DIR) -> Path:
    return Path(directory) / f"{benchmark}.json"


def load_baseline(benchmark: str, directory: Path = DEFAULT_DIR) -> Baseline | None:
    path = baseline_path(benchmark, directory)
    if not path.exists():
        return None
    return Baseline.from_dict(json.loads(path.read_text()))


def save_baseline(baseline: Baseline, directory: Path = DEFAULT_DIR) -> Path:
    """Write atomically: an interrupted run leaves the previous baseline whole."""
    path = baseline_path(baseline.benchmark, directory)
    atomic_write(path, lambda tmp: Path(tmp).write_text(baseline.to_json()))
    return path


def current_commit(repo: Path = REPO) -> str:
    """HEAD's short hash ('-dirty' with uncommitted changes), or 'unknown' without git (a
    copy of the tree on another machine): metadata only, no code is read from git."""
    state = git_state(Path(repo))
    if state["commit"] is None:
        return "unknown"
    return state["commit"][:7] + ("-dirty" if state["dirty"] else "")


def new_baseline(benchmark: str, argv: list[str] | None, settings: dict, figures: dict, machine: Machine,
                 note: str = "") -> Baseline:
    """This run's figures as a baseline (``argv``: the benchmark's arguments, for the command)."""
    args = sys.argv[1:] if argv is None else argv
    return Baseline(benchmark=benchmark, command=" ".join(["python -m runners." + benchmark, *args]),
                    commit=current_commit(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    machine=machine, figures=figures, settings=settings, note=note)


# ---------------------------------------------------------------- what a benchmark uses
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--save-baseline", action="store_true",
                    help="store this run's figures as the new baseline (results/bench/<benchmark>.json)")
    ap.add_argument("--no-baseline", action="store_true", help="no comparison with the stored baseline")
    ap.add_argument("--baseline-dir", type=Path, default=DEFAULT_DIR, help="where stored baselines live")


@dataclass
class Comparison:
    """The stored baseline a run compares with (None: none stored, or not asked) and the
    lines that say where it came from, printed above the table."""

    baseline: Baseline | None
    header: list[str]

    def value(self, row: str, quantity: str) -> float | None:
        return self.baseline.value(row, quantity) if self.baseline is not None else None


def compare_with_stored(benchmark: str, args: argparse.Namespace, settings: dict,
                        machine: Machine | None) -> Comparison:
    """The stored baseline for this run (``args``: ``add_arguments``' flags), checked
    against this machine and these settings."""
    if args.no_baseline:
        return Comparison(None, ["baseline comparison skipped (--no-baseline)"])
    path = baseline_path(benchmark, args.baseline_dir)
    stored = load_baseline(benchmark, args.baseline_dir)
    if stored is None:
        return Comparison(None, [f"no stored baseline ({path}): current figures only"])
    header = [f"baseline: {path.name}, commit {stored.commit}, measured {stored.date}",
              f"  there: {stored.machine.describe()}"]
    if machine is not None:
        header.append(f"  here:  {machine.describe()}")
    if stored.note:
        header += textwrap.wrap(stored.note, 100, initial_indent="  note: ", subsequent_indent="    ")
    header += [w for w in (machine and machine_warning(stored.machine, machine),
                           settings_warning(stored.settings, settings)) if w]
    return Comparison(stored, header)
