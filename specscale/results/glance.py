"""Results at a glance: one row per cell, what a researcher reads first.

Printed at the end of every run and sweep (the cells it covered, done now or before) and
by ``specscale show RESULTS_DIR [key=value ...] [--csv OUT]`` for any store. A row names
how the numbers were obtained (simulated on a roofline or a profile, or measured on an
engine), the policy and shape, output tokens/s with its ratio to nonspec on the same
condition and seed, the makespan speed-up over that nonspec (the two differ when a policy
returns shorter answers), accuracy with its 95% interval, p99 latency and the cell's
folder. A failed cell is a row with its one-line reason.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import pandas as pd

from specscale.results.index import cell_folders, read_cell

COLUMNS = ("measured", "policy", "beam", "conc", "setting", "output_tok_s", "vs_nonspec", "speedup", "accuracy",
           "p99_s", "cell")
# Settings a sweep varies besides policy, beam and concurrency: the "setting" column names
# those whose values differ among the rows shown (seed 0/1/2, ablation, search, B_max, ...),
# so rows that would otherwise read alike are told apart.
VARYING = ("model", "dataset", "search", "ablation", "expansion", "n_problems", "workload", "rate",
           "policy_b_max", "seed")


def engine_kind(summary: Mapping[str, Any]) -> str:
    """How a cell's numbers were obtained, in words."""
    engine, hardware = str(summary.get("engine")), str(summary.get("hardware"))
    if engine == "sim":
        if hardware.startswith("profiled:"):
            return f"simulated (profile {hardware[len('profiled:'):]})"
        return f"simulated (roofline {hardware}, calibrated)"
    device = (summary.get("provenance") or {}).get("device") or {}
    where = device.get("name") or hardware
    if engine == "vllm":
        version = ((summary.get("provenance") or {}).get("versions") or {}).get("vllm")
        return f"measured: vLLM {version} on {where}" if version else f"measured: vLLM on {where}"
    return f"measured: {engine} on {where}"


def read_cells(dirs: Iterable[Path], root: Optional[Path] = None) -> list[dict]:
    """The summary (or error) of each cell folder; folders with neither are left out."""
    return [r for r in (read_cell(d, root) for d in dirs) if r is not None]


def store_cells(root: Path) -> list[dict]:
    """Every cell below root (done or failed)."""
    return read_cells(cell_folders(root), Path(root))


def table(cells: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The glance table of these cells: the nonspec cell of the same condition and seed
    (context_hash, seed) gives the ratios, where it is among them."""
    done = [c for c in cells if c.get("status") == "ok"]
    base = {(c.get("context_hash"), c.get("seed")): c for c in done if c.get("policy") == "nonspec"}
    varying = [k for k in VARYING if len({str(c.get(k)) for c in done}) > 1]
    rows = []
    for c in done:
        ref = base.get((c.get("context_hash"), c.get("seed")))
        rows.append({
            "measured": engine_kind(c), "policy": c.get("policy"), "beam": c.get("beam"),
            "conc": c.get("concurrency"), "setting": " ".join(f"{_short(k)}={c.get(k)}" for k in varying
                                                 if c.get(k) is not None),  # None: a switch its policy ignores
            "output_tok_s": c.get("output_tok_s"),
            "vs_nonspec": _ratio(c.get("output_tok_s"), ref and ref.get("output_tok_s")),
            "speedup": _ratio(ref and ref.get("makespan_s"), c.get("makespan_s")),
            "accuracy": c.get("accuracy"), "accuracy_low": c.get("accuracy_ci_low"),
            "accuracy_high": c.get("accuracy_ci_high"), "p99_s": c.get("latency_p99_s"),
            "cell": c.get("cell_dir"), "status": "done", "error": None,
        })
    for c in cells:
        if c.get("status") != "ok":
            rows.append({"measured": None, "policy": None, "cell": c.get("cell_dir"), "status": "failed",
                         "error": _one_line(c)})
    return pd.DataFrame(rows)


def _short(key: str) -> str:
    return key.removeprefix("policy_")


def _ratio(a: Any, b: Any) -> Optional[float]:
    try:
        return float(a) / float(b) if a is not None and b else None
    except (TypeError, ValueError):
        return None


def _one_line(cell: Mapping[str, Any]) -> str:
    text = str(cell.get("error") or "no error recorded").strip().splitlines()
    kind = cell.get("error_type")
    return (f"{kind}: " if kind else "") + (text[-1] if text else "")


def render(df: pd.DataFrame, title: str = "results at a glance") -> None:
    """The table on the terminal (rich); failed cells last, with their reason."""
    from rich.console import Console
    from rich.table import Table

    cells = [str(c) for c in df["cell"]] if len(df) else []
    below = _common_folder(cells)
    if below:
        title += f" (cells below {below}/)"
    out = Table(title=title, title_justify="left")
    for name, justify in (("measured", "left"), ("policy", "left"), ("beam", "right"), ("conc", "right"),
                          ("setting", "left"), ("output tok/s", "right"), ("vs nonspec", "right"), ("speed-up", "right"),
                          ("accuracy [95% CI]", "right"), ("p99 s", "right"), ("cell", "left")):
        out.add_column(name, justify=justify, overflow="fold", no_wrap=name == "measured")
    if below:
        df = df.assign(cell=[c[len(below) + 1:] for c in cells])
    done = df[df["status"] == "done"] if len(df) else df
    for r in done.itertuples():
        acc = "" if _missing(r.accuracy) else f"{r.accuracy:.3f} [{r.accuracy_low:.2f}, {r.accuracy_high:.2f}]"
        out.add_row(str(r.measured), str(r.policy), _num(r.beam, "{:.0f}"), _num(r.conc, "{:.0f}"),
                    str(r.setting or ""), _num(r.output_tok_s, "{:.1f}"), _num(r.vs_nonspec, "{:.2f}"), _num(r.speedup, "{:.2f}x"),
                    acc, _num(r.p99_s, "{:.1f}"), str(r.cell))
    for r in (df[df["status"] == "failed"].itertuples() if len(df) else ()):
        out.add_row("[red]failed[/red]", "", "", "", "", "", "", "", "", "", f"{r.cell}: {r.error}")
    Console(width=max(Console().width, 180)).print(out)


def _common_folder(paths: Sequence[str]) -> str:
    """The folder every cell lies below (printed once, in the title), or ''."""
    import os

    if len(paths) < 1:
        return ""
    common = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    return "" if common in ("", "/", ".") else common


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _num(v: Any, fmt: str) -> str:
    return "" if _missing(v) else fmt.format(v)


def filtered(cells: Sequence[Mapping[str, Any]], filters: Sequence[str]) -> list[Mapping[str, Any]]:
    """Cells whose summary has key=value for every filter (values compared as text)."""
    wanted = []
    for f in filters:
        key, sep, value = f.partition("=")
        if not sep:
            raise SystemExit(f"specscale show: a filter is KEY=VALUE (e.g. policy=full), got {f!r}")
        wanted.append((key, value))
    return [c for c in cells if all(str(c.get(k)) == v for k, v in wanted)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="specscale show", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", type=Path, help="a results store, or any folder below one")
    ap.add_argument("filters", nargs="*", help="KEY=VALUE on summary fields, e.g. policy=full beam=8")
    ap.add_argument("--csv", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: specscale show: {args.results_dir} is not a folder", file=sys.stderr)
        return 2
    every = store_cells(args.results_dir)
    keep = {c["cell_dir"] for c in filtered(every, args.filters)}
    if not keep:
        print(f"no cells below {args.results_dir}" + (f" matching {' '.join(args.filters)}" if args.filters else ""))
        return 0
    df = table(every)  # ratios from every cell of the store: a filter must not hide the nonspec reference
    df = df[df["cell"].isin(keep)].reset_index(drop=True)
    render(df, f"{len(df)} cells below {args.results_dir}")
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
        print(f"written: {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
