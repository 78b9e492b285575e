"""Shared drawing helpers: one colour per policy everywhere, grouped bars, panel grids.

Ours is drawn solid, the paper's hatched and lighter, so a figure reads the same way
in every family."""
from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, NullLocator, ScalarFormatter

from analysis.cells import POLICY_ORDER

MAX_PANELS = 6  # figures stay legible; every group is still in the table

# Okabe-Ito: told apart with every common colour-vision deficiency; each policy also has
# its own marker and line style, so a figure still reads in grey.
# In POLICY_ORDER; the pale yellow goes to ep_strict (a check policy, rarely drawn), the
# strongest colour to full.
_PALETTE = ("#000000", "#999999", "#E69F00", "#CC79A7", "#F0E442", "#56B4E9", "#0072B2", "#D55E00", "#009E73")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h")
_LINESTYLES = ("-", "--", "-.", ":", "-", "--", "-.", ":", "-")
POLICY_COLORS = dict(zip(POLICY_ORDER, _PALETTE))
POLICY_MARKERS = dict(zip(POLICY_ORDER, _MARKERS))
POLICY_LINESTYLES = dict(zip(POLICY_ORDER, _LINESTYLES))
PAPER_STYLE = {"hatch": "//", "alpha": 0.45, "edgecolor": "black", "linewidth": 0.5}


def policy_color(policy: str) -> str:
    return POLICY_COLORS.get(policy, "#999999")


def policy_style(policy: str) -> dict:
    """Colour, marker and line style of a policy's line: the same in every figure."""
    return {"color": policy_color(policy), "marker": POLICY_MARKERS.get(policy, "o"),
            "linestyle": POLICY_LINESTYLES.get(policy, "-")}


def panel_grid(n: int, width: float = 5.2, height: float = 3.6, max_cols: int = 3) -> tuple[Figure, list]:
    n = max(1, n)
    ncols = min(n, max_cols)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = [ax for row in fig.subplots(nrows, ncols, squeeze=False) for ax in row]
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def grouped_bars(ax, groups: Sequence[str], series: Sequence[Mapping], width: float = 0.8) -> None:
    """Bars per group; each series is {label, values, [err_low, err_high], color, paper}.
    NaN values leave a gap; err are distances below/above the value. Paper series get
    one shared legend entry instead of one per policy."""
    n = max(1, len(series))
    w = width / n
    x = np.arange(len(groups))
    paper_drawn = False
    for i, s in enumerate(series):
        vals = np.asarray(s["values"], dtype=float)
        pos = x - width / 2 + w * (i + 0.5)
        style = dict(PAPER_STYLE) if s.get("paper") else {}
        label = s["label"]
        if s.get("paper"):
            label, paper_drawn = (None if paper_drawn else "paper (hatched)"), True
        err = None
        if s.get("err_low") is not None:
            lo = np.asarray(s["err_low"], dtype=float)
            hi = np.asarray(s["err_high"], dtype=float)
            if not (np.all(np.isnan(lo)) and np.all(np.isnan(hi))):
                err = np.vstack([np.clip(np.nan_to_num(lo), 0, None), np.clip(np.nan_to_num(hi), 0, None)])
        ax.bar(pos, np.nan_to_num(vals, nan=0.0), w, color=s.get("color"), label=label, yerr=err,
               capsize=2 if err is not None else 0, **style)
    ax.set_xticks(x)
    ax.set_xticklabels(groups)


def ci_errors(mean: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(mean, dtype=float)
    return m - np.asarray(lo, dtype=float), np.asarray(hi, dtype=float) - m


def finish_legend(ax, fontsize: int = 7, outside: bool = False) -> None:
    """Legend inside (best spot) or, for crowded bar charts, to the right of the axes."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if outside:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=fontsize, loc="best")


def log2_axis(ax, values) -> None:
    """Log-2 x axis ticked at the tested values (beam, B_max, concurrency), as integers."""
    vals = sorted({float(v) for v in values if v == v})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    if vals:
        ax.set_xticks(vals)
        ax.set_xticklabels([f"{v:g}" for v in vals])


def plain_log_axis(ax) -> None:
    """Log x axis with plain-number labels and no minor labels (ECDFs of sizes)."""
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def cap_panels(groups: list, prefer: Optional[Callable[[object], bool]] = None) -> tuple[list, int]:
    """At most MAX_PANELS groups, those where prefer(rows) holds first (the contexts the
    paper reports, so its comparison is never the one cut); returns (shown, omitted)."""
    if prefer is not None:
        groups = sorted(groups, key=lambda kg: not prefer(kg[1]))  # stable: keeps order otherwise
    return groups[:MAX_PANELS], max(0, len(groups) - MAX_PANELS)


def footnote(fig: Figure, line: str) -> None:
    """Add a line under the figure. It is the figure's supxlabel, which takes part in the
    constrained layout, so it is never clipped and never overlaps a panel."""
    import textwrap

    size = 7
    width = max(20, int(fig.get_figwidth() * 72 / (0.55 * size)))  # characters of ~0.55 em across the page
    lines = [t for t in fig.get_supxlabel().split("\n") if t] + textwrap.wrap(line, width)
    fig.supxlabel("\n".join(lines), fontsize=size, style="italic")


def note_omitted(fig: Figure, omitted: int) -> None:
    if omitted:
        footnote(fig, f"{omitted} more context(s) not drawn; every context is in the table.")


def identity_scatter(ax, groups: Mapping[str, tuple[Sequence[float], Sequence[float]]], band: float = 0.0,
                     margin: float = 1.2) -> None:
    """Log-log scatter of (reference, prediction) per labelled group with the y = x line
    (and, with ``band``, dashed lines at x(1 +- band)): validation and fidelity plots."""
    xs = [v for x, _ in groups.values() for v in x]
    ys = [v for _, y in groups.values() for v in y]
    if not xs:
        return
    lo, hi = min(min(xs), min(ys)) / margin, max(max(xs), max(ys)) * margin
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    if band:
        for f in (1 - band, 1 + band):
            ax.plot([lo, hi], [lo * f, hi * f], color="gray", lw=0.8, ls="--")
    for label, (x, y) in groups.items():
        ax.scatter(x, y, s=20, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.legend(fontsize=7)


def layout_problems(fig: Figure) -> list[str]:
    """What a reader would find broken in fig once laid out: a panel with nothing drawn,
    text running off the canvas, panel titles or the figure's own titles overlapping each
    other, a legend covering another panel. Empty list: fit for a paper (as far as boxes can tell)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox
    axes = [ax for ax in fig.axes if ax.get_visible()]
    labelled = []  # (what, box)
    for i, ax in enumerate(axes):
        for what, t in ((f"panel {i + 1} title", ax.title), (f"panel {i + 1} x label", ax.xaxis.label),
                        (f"panel {i + 1} y label", ax.yaxis.label)):
            if t.get_visible() and t.get_text():
                labelled.append((what, t.get_window_extent(renderer)))
    # The figure's own title and footnote artists (matplotlib keeps them as attributes;
    # the public getters return only their text).
    for what, t in (("figure title", fig._suptitle), ("footnote", fig._supxlabel)):
        if t is not None and t.get_visible() and t.get_text():
            labelled.append((what, t.get_window_extent(renderer)))
    def has_data(ax) -> bool:
        # Reference lines (axhline / axvline: drawn in the axis' blended transform) are not data.
        refs = (ax.get_xaxis_transform(), ax.get_yaxis_transform())
        lines = [ln for ln in ax.lines if not any(ln.get_transform() is r for r in refs) and len(ln.get_xydata())]
        return bool(lines or ax.patches or ax.collections or ax.images)

    problems = [f"panel {i + 1} is empty" for i, ax in enumerate(axes) if not has_data(ax)]
    problems += [f"{what} runs off the canvas" for what, box in labelled
                if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y0 < page.y0 - 1 or box.y1 > page.y1 + 1]
    titles = [(w, b) for w, b in labelled if "title" in w or w == "footnote"]
    problems += [f"{a} overlaps {b}" for i, (a, box_a) in enumerate(titles) for b, box_b in titles[i + 1:]
                 if box_a.overlaps(box_b)]
    for i, ax in enumerate(axes):
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        box = legend.get_window_extent(renderer)
        problems += [f"panel {i + 1} legend covers panel {j + 1}" for j, other in enumerate(axes)
                     if j != i and box.overlaps(other.get_window_extent(renderer))]
    return problems
