"""Which cells are comparable: contexts, policy variants, seeds, baselines.

Two cells are comparable when they share a *context*: every summary field that sets
the workload and the search budget (model, dataset, hardware, beam, concurrency, ...).
Within a context, cells differ by policy and seed; a paired comparison matches cells
of the same seed, whose logical samples are identical by construction (docs/design.md §4), so
per-seed ratios cancel the draw-to-draw variation that unpaired means would keep.

A policy *variant* is a cell whose policy switches differ from the paper's settings for
that policy name (e.g. `full` with `policy.b_max=512`). Paper figures other than the
sensitivity study use the canonical cells only.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from analysis.stats import t_interval

# Summary fields that fix what a cell computes apart from the policy and the seed.
# settings_hash covers every other setting (engine internals, synthetic workload, caps):
# cells that differ only there are different conditions even if no column says how.
# ablation: the sim mechanism switched off (conf/ablation/; "none" for every other cell);
# search: search.kind (conf/search/; cells from before it existed have none: beam search).
CONTEXT = ("model", "dataset", "engine", "hardware", "search", "workload", "rate", "beam", "expansion",
           "concurrency", "n_problems", "temperature", "max_rounds", "ablation", "settings_hash")

# The paper's settings for the switches a sweep may tune (docs/paper.md §6.1: a 2,048-token
# threshold, six deferrals; speculation depth one). Used when conf/policy is absent.
TUNING_DEFAULTS = {"policy_depth": 1, "policy_b_max": 2048, "policy_d_max": 6,
                   "policy_sibling_trigger": True, "policy_age_cap_s": None}

# Policies in the paper's cumulative order (Fig. 13), then the controls of docs/paper.md §12.
POLICY_ORDER = ("nonspec", "nonspec_cd", "spec", "fasttts", "ep_strict", "ep", "ep_cd", "full", "adaptive")


def is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def same_value(a: Any, b: Any) -> bool:
    if is_missing(a) or is_missing(b):
        return is_missing(a) and is_missing(b)
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return str(a) == str(b)


def policy_defaults(conf_dir: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    """`{policy name: {policy_<switch>: value}}` from the repository's conf/policy/*.yaml.
    Empty when the directory is not there (analysis run outside the repository)."""
    if conf_dir is None:
        from specscale.resources import conf_dir as harness_conf

        conf_dir = harness_conf() / "policy"
    conf_dir = Path(conf_dir)
    if not conf_dir.is_dir():
        return {}
    from omegaconf import OmegaConf

    out = {}
    for path in sorted(conf_dir.glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        name = cfg.pop("name", path.stem)
        out[str(name)] = {f"policy_{k}": v for k, v in cfg.items()}
    return out


def variant_label(row: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]]) -> str:
    """'' for a canonical cell, else 'b_max=512,d_max=4': the switches that differ.

    A switch recorded as None was unused by the policy's modes (the results store
    blanks them, e.g. b_max of a non-lazy policy) and never makes a variant."""
    ref = dict(TUNING_DEFAULTS)
    ref.update(defaults.get(str(row.get("policy")), {}))
    unused = unused_switches(row)
    diffs = []
    for key, want in ref.items():
        if key in unused or key not in row or is_missing(row[key]):
            continue
        if not same_value(row[key], want):
            diffs.append(f"{key[len('policy_'):]}={_fmt(row[key])}")
    return ",".join(diffs)


def unused_switches(row: Mapping[str, Any]) -> set[str]:
    """Switches the policy's modes ignore (docs/design.md §3): the LV knobs without lazy
    verification, the depth without speculation. An `ep_cd` cell swept over b_max is
    the same computation at every value, so it must not count as a variant."""
    out = set()
    if "policy_verification" in row and str(row["policy_verification"]) not in ("lazy", "adaptive"):
        out |= {"policy_b_max", "policy_d_max", "policy_sibling_trigger", "policy_age_cap_s"}
    elif "policy_verification" in row and str(row["policy_verification"]) == "adaptive":
        out |= {"policy_b_max", "policy_d_max"}  # adaptive keeps only the sibling trigger and the age cap
    if "policy_speculation" in row and str(row["policy_speculation"]) == "none":
        out.add("policy_depth")
    return out


def with_variants(cells: pd.DataFrame, defaults: Optional[Mapping[str, Mapping[str, Any]]] = None) -> pd.DataFrame:
    defaults = policy_defaults() if defaults is None else defaults
    labels = [variant_label(r, defaults) for r in cells.to_dict("records")] if len(cells) else []
    return cells.assign(variant=pd.Series(labels, index=cells.index, dtype=object))


def context_columns(df: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    ex = set(exclude)
    return [c for c in CONTEXT if c in df.columns and c not in ex]


def dedupe(cells: pd.DataFrame) -> pd.DataFrame:
    """One cell per (context, policy, variant, seed). Experiments share cells (the
    nonspec cell of Fig. 13 is also Fig. 15's); identical configs give identical
    results, so the duplicates carry no information."""
    keys = context_columns(cells) + [c for c in ("policy", "variant", "seed") if c in cells.columns]
    if not len(cells) or not keys:
        return cells
    return cells.loc[~_keyframe(cells, keys).duplicated(keep="last")]


def _keyframe(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    # groupby drops NaN keys (rate is NaN for saturated cells): compare as text instead.
    return df[list(keys)].astype(object).where(df[list(keys)].notna(), "∅").astype(str)


def key_series(df: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    """One NaN-safe text key per row (for maps and transforms over groups)."""
    keys = [k for k in keys if k in df.columns]
    if not keys or not len(df):
        return pd.Series("", index=df.index, dtype=object)
    return _keyframe(df, keys).agg("|".join, axis=1)


def group_by(df: pd.DataFrame, keys: Sequence[str]) -> list[tuple[dict, pd.DataFrame]]:
    """Groups with NaN-safe keys: [(key values, rows)], in first-appearance order."""
    keys = [k for k in keys if k in df.columns]
    if not len(df):
        return []
    if not keys:
        return [({}, df)]
    kf = _keyframe(df, keys)
    out = []
    for _, sub in kf.groupby(list(keys), sort=False):
        rows = df.loc[sub.index]
        out.append(({k: rows[k].iloc[0] for k in keys}, rows))
    return out


TITLE_WIDTH = 42  # characters per line of a panel title (a 9-point title across a ~4.5-inch panel)


def context_label(key: Mapping[str, Any], varying: Iterable[str]) -> str:
    """A short title naming only the context fields that vary across groups, wrapped so a
    store holding several kinds of cell (models, engines, experiments) keeps it inside its panel."""
    import textwrap

    parts = [f"{k}={_fmt(key[k])}" for k in varying if k in key]
    return textwrap.fill(", ".join(parts), width=TITLE_WIDTH) if parts else "all cells"


def varying_columns(df: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    kf = _keyframe(df, [c for c in cols if c in df.columns]) if len(df) else pd.DataFrame()
    return [c for c in kf.columns if kf[c].nunique() > 1]


def _fmt(v: Any) -> str:
    if is_missing(v):
        return "-"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def seed_summary(values: Sequence[float], conf: float = 0.95) -> dict[str, float]:
    """Mean over seeds with a t-interval (NaN bounds for a single seed)."""
    vals = np.asarray([v for v in values if not is_missing(v)], dtype=float)
    if len(vals) == 0:
        return {"mean": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "n_seeds": 0}
    lo, hi = t_interval(vals, conf) if len(vals) > 1 else (float("nan"), float("nan"))
    return {"mean": float(vals.mean()), "ci_low": lo, "ci_high": hi, "n_seeds": int(len(vals))}


def relative_to(cells: pd.DataFrame, metric: str, baseline: pd.DataFrame, keys: Sequence[str],
                out: str = "rel") -> pd.DataFrame:
    """cells[metric] / baseline[metric] for the baseline cell with the same keys (and seed).

    Rows without a matching baseline get NaN; several baseline cells per key (shouldn't
    happen after dedupe) are averaged."""
    keys = [k for k in keys if k in cells.columns and k in baseline.columns]
    if not len(cells):
        return cells.assign(**{out: pd.Series(dtype=float)})
    base = baseline[metric].astype(float).groupby(key_series(baseline, keys)).mean()
    k = key_series(cells, keys)
    denom = k.map(base)
    return cells.assign(**{out: cells[metric].astype(float) / denom.astype(float)})


def policy_sort_key(policies: pd.Series) -> pd.Series:
    order = {p: i for i, p in enumerate(POLICY_ORDER)}
    return policies.map(lambda p: order.get(p, len(order)))


def ordered_policies(policies: Iterable[str]) -> list[str]:
    order = {p: i for i, p in enumerate(POLICY_ORDER)}
    return sorted(set(policies), key=lambda p: (order.get(p, len(order)), p))


def canonical(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["variant"] == ""] if "variant" in cells.columns else cells


def prepare(index: pd.DataFrame, defaults: Optional[Mapping[str, Mapping[str, Any]]] = None) -> pd.DataFrame:
    """The completed cells of an index, labelled by variant, one per configuration."""
    ok = index[index["status"] == "ok"] if "status" in index.columns else index
    if "policy" not in ok.columns:
        return ok.iloc[0:0].assign(variant=pd.Series(dtype=object), policy=pd.Series(dtype=object))
    return dedupe(with_variants(ok.reset_index(drop=True), defaults)).reset_index(drop=True)


def saturated(cells: pd.DataFrame) -> pd.DataFrame:
    """Throughput cells: every request arrives at t=0 (docs/paper.md §8: capacity, not queueing)."""
    return cells[cells["workload"] == "saturated"] if "workload" in cells.columns else cells


def poisson(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["workload"] == "poisson"] if "workload" in cells.columns else cells.iloc[0:0]


def of_policy(cells: pd.DataFrame, *policies: str) -> pd.DataFrame:
    return cells[cells["policy"].isin(policies)]


def sort_rows(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Sorted by the given keys, policies in the paper's order rather than alphabetically."""
    keys = [k for k in keys if k in df.columns]
    if not len(df) or not keys:
        return df.reset_index(drop=True)
    return df.sort_values(keys, key=lambda s: policy_sort_key(s) if s.name == "policy" else s,
                          kind="stable").reset_index(drop=True)


def engine_kinds(cells: pd.DataFrame, drawn: Optional[pd.DataFrame] = None) -> list[str]:
    """How the numbers of these cells were obtained, in words (``specscale.results.glance.
    engine_kind``: simulated on a roofline or a profile, measured on an engine and device),
    in order of first appearance. With ``drawn`` (a table derived from the cells, keeping
    their engine and hardware columns) only the cells of the engines and hardware it holds."""
    from specscale.results.glance import engine_kind

    keys = {"engine", "hardware"}
    if drawn is not None and keys <= set(drawn.columns) and keys <= set(cells.columns):
        shown = set(zip(drawn["engine"].astype(str), drawn["hardware"].astype(str)))
        cells = cells[[(str(e), str(h)) in shown for e, h in zip(cells["engine"], cells["hardware"])]]
    kinds: list[str] = []
    for row in cells.to_dict("records"):
        kind = row.get("measured")
        if is_missing(kind):  # cells written before summaries named it: derived as the summary would
            kind = engine_kind({"engine": row.get("engine"), "hardware": row.get("hardware"),
                                "provenance": {"device": {"name": row.get("provenance_device_name")},
                                               "versions": {"vllm": row.get("provenance_versions_vllm")}}})
        if kind not in kinds:
            kinds.append(str(kind))
    return kinds

