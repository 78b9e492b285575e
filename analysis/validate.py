"""`python -m analysis.validate`: the sim's predictions of the paper's numbers, under the
validation protocol (results/validation/protocol.yaml).

    python -m analysis.validate [--engine sim] [--n-problems N] [--seeds 0,1,2] [--jobs 2]
        [--results-dir results/runs] [--sealed [--looks results/validation/looks.csv] [--note TEXT]]

By default scores the protocol's ``DEVELOP`` set (numbers that may be looked at while
building; never fitted) and writes ``<results_dir>/validation/validation.csv|.md|.json``
and a predicted-vs-paper scatter with the y = x line. ``--sealed`` scores the ``SEALED``
set (the paper's claims) instead, writes ``<results_dir>/validation/sealed.csv|.md|.json``
and appends exactly one line to the looks file: every sealed score is a look, counted
per protocol version. A look is refused when the protocol file changed (another hash)
under a version that has already been looked at: bump ``version`` in protocol.yaml.

``n_problems`` and the seeds default to the protocol's (a prediction is the mean over
the seeds); other values run, with a warning that the run is not a protocol score (a
sealed look records so in its note). The engine profile defaults to the calibrated
``engine=sim`` (``engine=sim_roofline``: the hand-set guesses). Each target: predicted,
paper, relative error, its rule (±15% for numbers; an ordering or bound for qualitative
claims), whether it holds, and the makespan ratio beside each throughput ratio.
``python -m analysis.report`` shows the tables in its "Validation" section. Misses are
reported as misses.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from analysis.output import Section, add_figure, new_figure, save_figure, save_table, side_run_table, to_markdown
from analysis.plots import identity_scatter
from specscale.calibration.evaluate import Evaluator, table
from specscale.calibration.protocol import Protocol, parse_seeds, protocol
from specscale.calibration.targets import DEVELOP, NOT_PRODUCED, SEALED, Target, cells_of
from specscale.resources import CHECKOUT

SUBDIR = "validation"
LOOKS_COLUMNS = ("date", "commit", "protocol_version", "protocol_hash", "set", "n_targets", "numeric_within",
                 "numeric_total", "orderings_held", "orderings_total", "score", "note")


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def validation_table(targets: Sequence[Target], predicted: Sequence[float],
                     beside: Optional[Sequence[float]] = None) -> pd.DataFrame:
    return pd.DataFrame(table(targets, predicted, beside))


def _numeric(df: pd.DataFrame) -> pd.Series:
    return df["rule"].astype(str).str.startswith("±")


def headline(df: pd.DataFrame, label: str = "held-out") -> str:
    numeric, other = df[_numeric(df)], df[~_numeric(df)]
    return (f"{int(numeric['pass'].sum())}/{len(numeric)} numeric {label} targets within their tolerance "
            f"({100 * numeric['pass'].mean():.0f}%); {int(other['pass'].sum())}/{len(other)} orderings and bounds "
            "hold" if len(numeric) else "no numeric targets")


def scatter(df: pd.DataFrame, label: str = "Held-out"):
    """Predicted vs paper for the numeric targets (log-log, y = x and ±15% lines)."""
    num = df[_numeric(df)]
    num = num[num["predicted"].apply(lambda v: isinstance(v, float) and math.isfinite(v) and v > 0)]
    fig, (ax,) = new_figure(width=5.6, height=5.0)
    identity_scatter(ax, {str(u) or "-": (g["paper"].astype(float).tolist(), g["predicted"].tolist())
                          for u, g in num.groupby("unit")}, band=0.15, margin=1.3)
    ax.set_xlabel("paper")
    ax.set_ylabel("sim prediction")
    ax.set_title(f"{label} targets: sim vs paper (dashed: ±15%)", fontsize=9)
    return fig


def write(df: pd.DataFrame, meta: dict, out_dir: Path, name: str = "validation") -> Path:
    """<out_dir>/<name>.csv|.md|.json (and, for the develop table, its scatter)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, _ = save_table(df, out_dir, name)
    if name == "validation":
        save_figure(scatter(df), out_dir, "validation_scatter")
    (out_dir / f"{name}.json").write_text(json.dumps({**meta, "headline": headline(df, meta.get("set", "held-out"))},
                                                     indent=1))
    return csv_path


# ---------------------------------------------------------------------- looks
def default_looks_path() -> Path:
    """The checkout's results/validation/looks.csv; outside a checkout (an installed
    wheel), results/validation/looks.csv under the working directory."""
    here = CHECKOUT / "results" / "validation"
    return here / "looks.csv" if (here / "protocol.yaml").is_file() else Path("results/validation/looks.csv")


def read_looks(path: Path) -> list[dict[str, str]]:
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def looks_under(looks: Sequence[dict[str, str]], version: int) -> int:
    """Sealed looks recorded under a protocol version."""
    return sum(1 for r in looks if r.get("set") == "sealed" and r.get("protocol_version") == str(version))


def refusal(looks: Sequence[dict[str, str]], proto: Protocol) -> Optional[str]:
    """Why a sealed look under this protocol must be refused, or None. A version whose
    sealed set has been looked at is frozen: its file (hash) may not change under it."""
    changed = [r for r in looks if r.get("protocol_version") == str(proto.version)
               and r.get("protocol_hash") and r["protocol_hash"] != proto.hash]
    if changed:
        return (f"refused: protocol v{proto.version} was looked at with hash {changed[-1]['protocol_hash']}, but "
                f"{proto.path} now hashes to {proto.hash}; a change after a look needs a new protocol: bump "
                f"`version` in {proto.path.name}")
    return None


def git_commit() -> str:
    """HEAD's short hash, with +dirty when the tree has changes or files git does not
    ignore beyond it; "" without git (an installed wheel, no git on the machine)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass(frozen=True)
class Score:
    n_targets: int
    numeric_within: int
    numeric_total: int
    orderings_held: int
    orderings_total: int

    @property
    def score(self) -> float:
        """The fraction of numeric targets within their tolerance."""
        return self.numeric_within / self.numeric_total if self.numeric_total else math.nan


def score_of(df: pd.DataFrame) -> Score:
    numeric, other = df[_numeric(df)], df[~_numeric(df)]
    return Score(len(df), int(numeric["pass"].sum()), len(numeric), int(other["pass"].sum()), len(other))


def append_look(path: Path, proto: Protocol, s: Score, note: str) -> dict[str, str]:
    """One line of the looks file (created with its header if absent)."""
    row = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
           "protocol_version": str(proto.version), "protocol_hash": proto.hash, "set": "sealed",
           "n_targets": str(s.n_targets), "numeric_within": str(s.numeric_within),
           "numeric_total": str(s.numeric_total), "orderings_held": str(s.orderings_held),
           "orderings_total": str(s.orderings_total), "score": "" if math.isnan(s.score) else f"{s.score:.4f}",
           "note": note}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LOOKS_COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)
    return row


# ---------------------------------------------------------------------- report
def _side_table(results_dir: Path, name: str) -> tuple[Optional[pd.DataFrame], dict]:
    src = Path(results_dir) / SUBDIR / f"{name}.csv"
    if not src.is_file():
        return None, {}
    meta_path = src.with_suffix(".json")
    return pd.read_csv(src), (json.loads(meta_path.read_text()) if meta_path.is_file() else {})


def _scale(meta: dict) -> str:
    seeds = meta.get("seeds", [meta["seed"]] if "seed" in meta else "?")
    return f"{meta.get('profile', '?')} profile, n_problems={meta.get('n_problems')}, seeds={seeds}"


def build_section(results_dir: Optional[Path], out: Path, looks: Optional[Path] = None) -> Section:
    """The report's section: the develop table and scatter of the last `analysis.validate`
    run, the sealed table of the last `--sealed` run if there is one, and the number of
    sealed looks under the current protocol version."""
    sec = Section("validation", "Validation (held-out paper numbers)")
    df = side_run_table(results_dir, SUBDIR, "validation", sec, "python -m analysis.validate --results-dir <dir>")
    if df is not None:
        _, meta = _side_table(results_dir, "validation")
        add_figure(sec, scatter(df), out, "validation_scatter",
                   numbers="simulated (roofline a100, calibrated) against the paper's reported values")
        csv_path, md = save_table(df, Path(out) / "tables", "validation")
        sec.tables.append((f"Develop targets (never fitted), {_scale(meta)}", csv_path, md))
        sec.notes.append(headline(df) + ".")
        for fig, why in NOT_PRODUCED.items():
            sec.notes.append(f"Not validated: {fig} ({why}).")
    sealed, meta = _side_table(results_dir, "sealed") if results_dir is not None else (None, {})
    if sealed is not None:
        csv_path, md = save_table(sealed, Path(out) / "tables", "validation_sealed")
        sec.tables.append((f"Sealed targets (one logged look, protocol v{meta.get('protocol_version', '?')} "
                           f"{meta.get('protocol_hash', '')}), {_scale(meta)}", csv_path, md))
        sec.notes.append(headline(sealed, "sealed") + ".")
    looks = Path(looks) if looks is not None else default_looks_path()
    if looks.is_file():
        version = protocol().version
        sec.notes.append(f"sealed looks under protocol v{version}: {looks_under(read_looks(looks), version)}.")
    return sec


# ---------------------------------------------------------------------- command
def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    proto = protocol()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="sim", help="engine profile: sim (calibrated) or sim_roofline")
    ap.add_argument("--n-problems", type=int, default=None,
                    help=f"problems per cell (default: the protocol's, {proto.n_problems})")
    ap.add_argument("--seeds", type=parse_seeds, default=None,
                    help=f"comma-separated seeds (default: the protocol's, {','.join(map(str, proto.seeds))})")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results-dir", default="results/runs")
    ap.add_argument("--sealed", action="store_true", help="score the sealed set: one logged look")
    ap.add_argument("--looks", type=Path, default=None, help="the looks file (default: "
                    "results/validation/looks.csv of the checkout)")
    ap.add_argument("--note", default="", help="a note for the look's line")
    return ap.parse_args(argv)


def off_protocol(args: argparse.Namespace, proto: Protocol) -> Optional[str]:
    """Why this run is not a protocol score (n or seeds not the protocol's), or None."""
    if (args.n_problems, args.seeds) == (proto.n_problems, proto.seeds):
        return None
    return (f"n_problems={args.n_problems}, seeds={list(args.seeds)} (the protocol's: n_problems={proto.n_problems}, "
            f"seeds={list(proto.seeds)}): not a protocol score")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    proto = protocol()
    args.n_problems = proto.n_problems if args.n_problems is None else args.n_problems
    args.seeds = proto.seeds if args.seeds is None else args.seeds
    which, targets = ("sealed", SEALED) if args.sealed else ("develop", DEVELOP)
    looks_path = args.looks or default_looks_path()
    if args.sealed:  # refused before anything runs: a refused look must not have been seen
        why = refusal(read_looks(looks_path), proto)
        if why:
            print(why, file=sys.stderr)
            return 2
    off = off_protocol(args, proto)
    if off:
        print(f"WARNING: {off}", flush=True)
    cells = cells_of(targets)
    print(f"validation ({which}, protocol v{proto.version} {proto.hash}): {len(targets)} targets over {len(cells)} "
          f"sim cells x {len(args.seeds)} seeds, engine={args.engine}, n_problems={args.n_problems}", flush=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    with Evaluator(n_problems=args.n_problems, seeds=args.seeds, jobs=args.jobs, base=(f"engine={args.engine}",),
                   progress=True) as ev:
        predicted = ev.predict(targets)
        beside = ev.beside(targets)
    df = validation_table(targets, predicted, beside)
    # CPU seconds of this process and its (joined) workers: what the sweep costs on a
    # quiet machine, whatever else shared the cores while it ran.
    meta = {"set": which, "profile": args.engine, "n_problems": args.n_problems, "seeds": list(args.seeds),
            "protocol_version": proto.version, "protocol_hash": proto.hash, "protocol_score": off is None,
            "jobs": args.jobs, "wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0, "cells": len(cells)}
    out = write(df, meta, Path(args.results_dir) / SUBDIR, "sealed" if args.sealed else "validation")
    if args.sealed:
        note = "; ".join(x for x in (args.note, f"engine={args.engine}", off) if x)
        append_look(looks_path, proto, score_of(df), note)
    print(to_markdown(df.drop(columns=["source"])))
    print(f"\n{headline(df, which)}; {meta['wall_s']:.0f} s wall, {meta['cpu_s']:.0f} CPU s for {len(cells)} cells "
          f"x {len(args.seeds)} seeds. Wrote {out}")
    if args.sealed:
        print(f"sealed looks under protocol v{proto.version}: {looks_under(read_looks(looks_path), proto.version)} "
              f"(this one appended to {looks_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
