"""`python -m analysis.report <results dir> [--out DIR] [--budgets 30,60]`

Writes <out>/report.md (default out: <results dir>/report) with every table and figure
the results allow, the paper's numbers beside ours, and one line for each figure it
could not draw and why. Missing data is never an exception: each section reports what
it lacks; a section that fails unexpectedly is reported as such and the rest go on.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence

import pandas as pd

from analysis import cells as C
from analysis import (fidelity, fig_adaptive, fig_beam_scaling, fig_breakdown, fig_concurrency, fig_dedup,
                      fig_lv_threshold, fig_mechanism_ablation, fig_occupancy, search_family, fig_prm_batches, fig_serving, fig_shortcut, fig_throughput, fig_waste, table_accuracy,
                      sensitivity, table_latency, table_throughput_reading, testbed, validate)
from analysis.loader import failed_cells, load_index
from analysis.output import Section, to_markdown
from analysis.paper import REFERENCE_NAME, load_reference


def sections(budgets: Optional[Sequence[float]],
             results_dir: Optional[Path] = None) -> list[tuple[str, Callable[..., Section]]]:
    """(title, builder(cells, ref, out)) in report order: the paper's figures, then the
    extras of docs/paper.md §12."""
    return [
        ("Fig. 13", fig_throughput.build),
        ("Throughput reading", table_throughput_reading.build),
        ("Fig. 15", fig_breakdown.build),
        ("Fig. 16", fig_lv_threshold.build),
        ("Adaptive verification", fig_adaptive.build),
        ("Serving curves", fig_serving.build),
        ("Concurrency sweep", fig_concurrency.build),
        ("Beam scaling", fig_beam_scaling.build),
        ("Occupancy", lambda cells, ref, out: fig_occupancy.build(cells, out)),
        ("Mechanism ablation", lambda cells, ref, out: fig_mechanism_ablation.build(cells, out)),
        ("Table 2", table_accuracy.build),
        ("Latency and goodput", lambda cells, ref, out: table_latency.build(cells, out, budgets)),
        ("Shortcut divergence", lambda cells, ref, out: fig_shortcut.build(cells, out)),
        ("Waste", lambda cells, ref, out: fig_waste.build(cells, out)),
        ("Physical/logical ratio", lambda cells, ref, out: fig_dedup.build(cells, out)),
        ("PRM batches", fig_prm_batches.build),
        ("Validation", lambda cells, ref, out: validate.build_section(results_dir, out)),
        ("Sensitivity", lambda cells, ref, out: sensitivity.build_section(results_dir, out)),
        ("Fidelity", lambda cells, ref, out: fidelity.build_section(results_dir, out)),
        ("Testbed", lambda cells, ref, out: testbed.build_section(results_dir, out)),
        ("Search family", lambda cells, ref, out: search_family.build(cells, out)),
    ]


def run_sections(cells: pd.DataFrame, ref: pd.DataFrame, out: Path,
                 budgets: Optional[Sequence[float]] = None, results_dir: Optional[Path] = None) -> list[Section]:
    done = []
    for title, build in sections(budgets, results_dir):
        try:
            done.append(build(cells, ref, out))
        except Exception as exc:  # noqa: BLE001 - one broken section must not lose the report
            sec = Section(title.lower().replace(" ", "_"), title)
            last = traceback.extract_tb(exc.__traceback__)[-1]
            sec.missing.append(f"{title}: analysis error {type(exc).__name__}: {exc} "
                               f"({Path(last.filename).name}:{last.lineno})")
            done.append(sec)
    return done


def cell_overview(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells per policy/variant x workload x beam, so a reader sees what the report rests on."""
    if not len(cells):
        return pd.DataFrame()
    cols = [c for c in ("policy", "variant", "workload", "beam") if c in cells.columns]
    g = cells.groupby(cols, dropna=False)
    out = g.size().rename("cells").reset_index()
    if "seed" in cells.columns:
        out["seeds"] = g["seed"].nunique().to_numpy()
    out["variant"] = out["variant"].replace("", "(paper settings)") if "variant" in out else None
    return C.sort_rows(out, cols)


def failed_lines(index: pd.DataFrame, root: Path) -> list[str]:
    lines = []
    for rec in failed_cells(index).to_dict("records"):
        what = ", ".join(f"{k}={rec[k]}" for k in ("policy", "beam", "seed", "workload") if not C.is_missing(rec.get(k)))
        err = str(rec.get("error") or "no error message").splitlines()[0][:160]
        lines.append(f"- `{_rel(rec.get('cell_dir'), root)}` ({what or 'config unknown'}): {rec.get('status')}, {err}")
    return lines


def render(results_dir: Path, out: Path, index: pd.DataFrame, cells: pd.DataFrame, ref: pd.DataFrame,
           secs: list[Section], ref_name: str = f"results/paper/{REFERENCE_NAME}") -> str:
    n_failed = int((index["status"] != "ok").sum()) if len(index) else 0
    lines = ["# SpecScale analysis report", "",
             f"Results: `{results_dir}` — {len(cells)} distinct completed cells "
             f"({int((index['status'] == 'ok').sum()) if len(index) else 0} indexed), {n_failed} failed or incomplete.",
             f"Paper numbers: `{ref_name}` ({len(ref)} values, see docs/paper.md)."
             if len(ref) else "Paper numbers: reference file not found; paper columns are empty.",
             "", "Ours is drawn solid, the paper's hatched or as open markers; `ratio_ours_to_paper` compares "
             "like with like (both normalised the same way). Engine `sim` numbers are modelled, not measured.", ""]
    engines = sorted(set(cells["engine"].dropna().astype(str))) if "engine" in cells.columns and len(cells) else []
    if engines:
        lines += [f"Engines: {', '.join(engines)}.", ""]
    missing = [m for s in secs for m in s.missing]
    lines += ["## Not drawn", ""]
    lines += [f"- {m}" for m in missing] if missing else ["Every figure and table was drawn."]
    lines += [""]
    if n_failed:
        lines += ["## Failed or incomplete cells (reported as missing)", "", *failed_lines(index, results_dir), ""]
    overview = cell_overview(cells)
    lines += ["## Cells", "", to_markdown(overview) if len(overview) else "No completed cells.", ""]
    lines += ["## Contents", ""]
    lines += [f"- {s.title}: " + (f"drawn ({_count(len(s.figures), 'figure')}, {_count(len({csv for _, csv, _ in s.tables}), 'table')})"
                                  if s.drawn else "not drawn") for s in secs]
    lines += [""]
    for s in secs:
        lines += [f"## {s.title}", ""]
        for fig in s.figures:
            rel = _rel(fig, out)
            lines += [f"![{s.title}]({rel})", "", f"Files: `{rel}`, `{rel[:-4]}.pdf`", ""]
        for caption, csv, md in s.tables:
            lines += [f"**{caption}** — `{_rel(csv, out)}`", "", md, ""]
        lines += [f"> {n}" for n in s.notes] + ([""] if s.notes else [])
        lines += [f"Not drawn: {m}" for m in s.missing] + ([""] if s.missing else [])
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _rel(path, base: Path) -> str:
    if path is None:
        return "?"
    try:
        return os.path.relpath(Path(path), Path(base)).replace(os.sep, "/")
    except ValueError:
        return str(path)


def make_report(results_dir: Path | str, out: Optional[Path | str] = None,
                budgets: Optional[Sequence[float]] = None, reference: Optional[Path] = None) -> Path:
    """Build every section and write <out>/report.md; returns its path."""
    results_dir = Path(results_dir)
    out = Path(out) if out else results_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    index = load_index(results_dir)
    cells = C.prepare(index)
    ref = load_reference(reference)
    secs = run_sections(cells, ref, out, budgets, results_dir)
    path = out / "report.md"
    ref_name = str(reference) if reference else f"results/paper/{REFERENCE_NAME}"
    path.write_text(render(results_dir, out, index, cells, ref, secs, ref_name))
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.splitlines()[0])
    ap.add_argument("results_dir", help="a results directory (cells and/or index.parquet below it)")
    ap.add_argument("--out", default=None, help="output directory (default: <results_dir>/report)")
    ap.add_argument("--budgets", default=None,
                    help="latency budgets in seconds, comma-separated (default: those in the summaries)")
    ap.add_argument("--reference", default=None, help="paper reference CSV (default: results/paper/)")
    args = ap.parse_args(argv)
    if not Path(args.results_dir).is_dir():
        print(f"error: {args.results_dir} is not a directory", file=sys.stderr)
        return 2
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()] if args.budgets else None
    path = make_report(args.results_dir, args.out, budgets, Path(args.reference) if args.reference else None)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
