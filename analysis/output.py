"""Writing tables (CSV + Markdown) and figures (PNG + PDF), and the section record
every figure family returns to the report.

Figures are built on `matplotlib.figure.Figure` objects directly, never through pyplot:
savefig then renders PNG with Agg and PDF with the PDF backend whatever the session's
interactive backend is, there is no global figure registry to leak into, and no display
is needed on a headless machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd
from matplotlib.figure import Figure

MD_MAX_ROWS = 60  # longer tables go to the report truncated; the CSV holds all rows


@dataclass
class Section:
    """What one figure family produced: files written, lines for the report, and the
    reasons for whatever it could not draw."""
    key: str
    title: str
    figures: list[Path] = field(default_factory=list)
    tables: list[tuple[str, Path, str]] = field(default_factory=list)  # (caption, csv path, markdown)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def drawn(self) -> bool:
        return bool(self.figures or self.tables)


def save_figure(fig: Figure, out_dir: Path, name: str) -> Path:
    """PNG and PDF of fig; returns the PNG path (the report embeds it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110)  # constrained layout already fits the labels
    fig.savefig(out_dir / f"{name}.pdf")
    return png


def save_table(df: pd.DataFrame, out_dir: Path, name: str) -> tuple[Path, str]:
    """CSV (all rows, full precision) and Markdown (rounded); returns (csv, markdown)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / f"{name}.csv"
    df.to_csv(csv, index=False)
    md = to_markdown(df)
    (out_dir / f"{name}.md").write_text(md + "\n")
    return csv, md


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def to_markdown(df: pd.DataFrame, max_rows: Optional[int] = None) -> str:
    """A GitHub Markdown table (no tabulate dependency); floats to 4 significant digits."""
    if not len(df.columns):
        return "_(empty)_"
    shown = df if max_rows is None or len(df) <= max_rows else df.head(max_rows)
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    more = [f"\n_… {len(df) - len(shown)} more rows in the CSV_"] if len(shown) < len(df) else []
    return "\n".join([head, sep, *body, *more])


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def fmt_list(items: Iterable[Any]) -> str:
    return ", ".join(str(i) for i in items)


def add_table(section: Section, df: pd.DataFrame, out_dir: Path, name: str, caption: str,
              paper_col: Optional[str] = None) -> None:
    """Write df as tables/<name>.csv|.md; the report shows the Markdown with context
    fields that are the same on every row moved into the caption. With paper_col, the
    rows where the paper reports a value are also shown on their own first, so a long
    sweep table cannot push the comparison with the paper out of the report."""
    csv, _ = save_table(df, Path(out_dir) / "tables", name)
    if paper_col and paper_col in df.columns:
        has = df[paper_col].notna() & (df[paper_col].astype(str) != "")
        if has.any() and not has.all():
            section.tables.append(_md_entry(df[has], f"{caption}: rows the paper reports", csv))
    section.tables.append(_md_entry(df, caption, csv))


def _md_entry(df: pd.DataFrame, caption: str, csv: Path) -> tuple[str, Path, str]:
    shown, const = split_constant(df)
    shown_const = {k: v for k, v in const.items() if v != ""}  # e.g. no rate for saturated cells
    if shown_const:
        caption = f"{caption} (all rows: {', '.join(f'{k}={v}' for k, v in shown_const.items())})"
    return caption, csv, to_markdown(shown, MD_MAX_ROWS)


def add_figure(section: Section, fig: Figure, out_dir: Path, name: str, cells: Optional[pd.DataFrame] = None,
               drawn: Optional[pd.DataFrame] = None, numbers: Optional[str] = None) -> None:
    """Save fig under figures/ with a footnote saying how its numbers were obtained: the
    engine kinds of ``cells`` (the cells it reads; ``drawn``: the table it draws, to keep
    only their engines and hardware), or ``numbers`` for figures read from elsewhere."""
    from analysis.plots import footnote

    if numbers is None and cells is not None and len(cells):
        from analysis.cells import engine_kinds

        numbers = "; ".join(engine_kinds(cells, drawn)) or None
    if numbers:
        footnote(fig, f"Numbers: {numbers}")
    from analysis.plots import layout_problems

    broken = layout_problems(fig)
    if broken:  # said in the report, not hidden: the figure is still written
        section.notes.append(f"Figure {name} is not fit for a paper: {'; '.join(broken)}.")
    section.figures.append(save_figure(fig, Path(out_dir) / "figures", name))


# Columns that describe the setting rather than a measurement: constant ones are folded
# into the caption so the Markdown stays narrow.
SETTING_COLUMNS = ("model", "dataset", "engine", "hardware", "workload", "rate", "beam", "expansion",
                   "concurrency", "n_problems", "temperature", "max_rounds")


def split_constant(df: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    const = {}
    if len(df) > 1:
        for c in SETTING_COLUMNS:
            if c in df.columns and df[c].map(_cell).nunique() == 1:
                const[c] = _cell(df[c].iloc[0])
    return df.drop(columns=list(const)), const


def side_run_table(results_dir: Optional[Path], subdir: str, name: str, section: Section,
                   command: str) -> Optional[pd.DataFrame]:
    """The table a separate command (validate, sensitivity, fidelity) wrote into
    <results_dir>/<subdir>/<name>.csv, or None with the command to run noted as missing."""
    src = Path(results_dir) / subdir / f"{name}.csv" if results_dir is not None else None
    if src is None or not src.is_file():
        section.missing.append(f"{section.title}: no {subdir} run in this results directory ({command})")
        return None
    return pd.read_csv(src)
