"""Declared targets: what the sim is fitted to, developed on, and scored against.

Every paper number the sim can produce is built once here, as a ``Target`` keyed by a
stable id (``fig13/qwen2.5-7b/b8/full/output_tok_s``, ``review/<statement>``); the
validation protocol (results/validation/protocol.yaml, read by ``protocol``) selects
three disjoint sets by these ids: ``CALIBRATION`` (the only numbers a fit may use),
``DEVELOP`` (may be looked at while building) and ``SEALED`` (scored only by
``python -m analysis.validate --sealed``, each score logged). Building fails if the
protocol lists an unknown id or leaves a produced target out. Paper numbers are looked
up in results/paper/specscale_reported.csv by their row (figure, policy, beam, metric,
...), never typed in; the paper's qualitative statements (ranges, orderings) carry
their section of docs/paper.md in ``source``.

A target names the sim *cells* it needs (overrides on top of the paper's setup:
Qwen2.5-7B + Qwen2.5-Math-PRM-7B, MATH-500, one A100, the protocol's arrivals and lazy
verification readings) and a ``measure`` that reads its prediction from their
summaries. Rules: ``rel`` (a number, passes within ``tol`` relative error), ``range``
(inside [value, high]), ``below`` / ``above`` (an ordering or bound: prediction < / >
value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np
import pandas as pd

from specscale.calibration.protocol import ProtocolError, protocol

PROTOCOL = protocol()
PAPER_SETUP = ("model=qwen2.5-7b", "dataset=math500", "hardware=a100")
THROUGHPUT = PROTOCOL.throughput_key  # output_tok_s: the returned path's tokens per second of makespan
LATENCY = PROTOCOL.latency_key  # the beam-32 targets' normalised latency (from arrival)
# The serving curves' request rates (the protocol's, the paper's range) and the
# concurrency sweep's limits (conf/experiment/concurrency_sweep.yaml's grid).
SERVING_RATES = PROTOCOL.serving_rates
CONCURRENCIES = (16, 32, 64, 128)
PAPER_CONCURRENCY = 32  # the paper's main maximum concurrency: conf/config.yaml's default (a test checks)


@dataclass(frozen=True)
class Cell:
    name: str
    overrides: tuple[str, ...]


def cell(policy: str, beam: int, *extra: str, model: str = "qwen2.5-7b", dataset: str = "math500",
         workload: Optional[str] = None) -> Cell:
    """A sim cell of the paper's setup; the protocol's trigger semantics are pinned on it
    (after the policy, so they override its config defaults)."""
    workload = workload or PROTOCOL.throughput_workload
    name = "_".join([policy, f"b{beam}", *(e.replace("=", "-").replace(".", "-") for e in extra)])
    if model != "qwen2.5-7b" or dataset != "math500":
        name += f"_{model}_{dataset}"
    if workload != PROTOCOL.throughput_workload:
        name += f"_{workload}"
    return Cell(name, (*PAPER_SETUP, f"model={model}", f"dataset={dataset}", f"workload={workload}",
                       f"policy={policy}", f"beam={beam}", *PROTOCOL.trigger_overrides, *extra))


Summaries = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Target:
    name: str
    cells: tuple[Cell, ...]
    measure: Callable[[Summaries], float]
    value: float
    rule: str = "rel"  # rel | range | below | above
    tol: float = 0.15
    high: Optional[float] = None
    source: str = ""
    unit: str = ""
    csv_row: Optional[int] = field(default=None, compare=False)  # row of the paper CSV, if from there
    id: str = ""  # stable id the protocol lists it by (figure/model/beam/subject/metric)
    # A reading reported beside the prediction, never scored: the makespan ratio beside a
    # throughput ratio (a policy returning shorter paths moves tok/s without saving time).
    beside: Optional[Callable[[Summaries], float]] = field(default=None, compare=False)

    def _undefined(self, predicted: Optional[float]) -> bool:
        """No prediction; an infinite one ("never saturates") is defined only for orderings."""
        return predicted is None or math.isnan(predicted) or (math.isinf(predicted) and self.rule in ("rel", "range"))

    def residual(self, predicted: float) -> float:
        """Scaled miss: 0 when the rule holds exactly, +-1 at the edge of the tolerance
        (rel), distance outside the range in units of its width (range), hinge for orderings."""
        if self._undefined(predicted):
            return 1e3
        if self.rule == "rel":
            return (predicted / self.value - 1.0) / self.tol
        if self.rule == "range":
            width = self.high - self.value
            if predicted < self.value:
                return (predicted - self.value) / width
            if predicted > self.high:
                return (predicted - self.high) / width
            return 0.0
        scale = abs(self.value) * self.tol or self.tol
        if self.rule == "below":  # capped like an undefined prediction ("never saturates" is inf)
            return min(max(0.0, predicted - self.value) / scale, 1e3)
        if self.rule == "above":
            return min(0.0, predicted - self.value) / scale
        raise ValueError(f"target {self.name}: unknown rule {self.rule!r}")

    def passes(self, predicted: float) -> bool:
        if self._undefined(predicted):
            return False
        if self.rule == "rel":
            return abs(predicted / self.value - 1.0) <= self.tol
        if self.rule == "range":
            return self.value <= predicted <= self.high
        return (predicted < self.value) if self.rule == "below" else (predicted > self.value)

    @property
    def numeric(self) -> bool:
        return self.rule == "rel"


# ---------------------------------------------------------------------- paper rows
@lru_cache(maxsize=1)
def paper_rows() -> pd.DataFrame:
    from specscale.resources import paper_csv  # the checkout's results/paper/ or the wheel's copy (loud if absent)

    return pd.read_csv(paper_csv(), dtype={"beam": "Int64"})


def paper(figure: str, metric: str, policy: Optional[str] = None, beam: Optional[int] = None,
          model: Optional[str] = None, baseline: Optional[str] = None, x_value: Optional[str] = None,
          relation: Optional[str] = None) -> tuple[float, int, str]:
    """(value, row index, source) of the one CSV row that matches; an error otherwise."""
    df = paper_rows()
    m = (df["figure"] == figure) & (df["metric"] == metric)
    for col, v in (("policy", policy), ("beam", beam), ("model", model), ("baseline", baseline),
                   ("x_value", x_value), ("relation", relation)):
        if v is not None:
            m &= df[col].astype(str) == str(v)
    rows = df[m]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} paper rows for {figure}/{metric} policy={policy} beam={beam} model={model} "
                          f"baseline={baseline} x={x_value}: expected exactly one")
    r = rows.iloc[0]
    return float(r["value"]), int(rows.index[0]), str(r["source"])


def _get(s: Summaries, cell_: Cell, key: str) -> float:
    return float(s[cell_.name][key])


def share(cell_: Cell, key: str) -> Callable[[Summaries], float]:
    """Percent of the cell's makespan spent in `key` (a time_*_s field)."""
    return lambda s: 100.0 * _get(s, cell_, key) / _get(s, cell_, "makespan_s")


def metric(cell_: Cell, key: str) -> Callable[[Summaries], float]:
    return lambda s: _get(s, cell_, key)


def ratio(num: Cell, den: Cell, key: str) -> Callable[[Summaries], float]:
    return lambda s: _get(s, num, key) / _get(s, den, key)


def speedup(num: Cell, den: Cell) -> Callable[[Summaries], float]:
    """den's makespan over num's: the time ratio beside a throughput ratio num / den."""
    return ratio(den, num, "makespan_s")


def pid(figure: str, model: Optional[str], beam: Optional[int], subject: str, metric_: str) -> str:
    """A paper target's id: figure/model/b<beam>/subject/metric (absent parts left out)."""
    return "/".join(p for p in (figure, model, f"b{beam}" if beam is not None else None, subject, metric_) if p)


# ---------------------------------------------------------------------- the fitted kind
NS4, NS8, SPEC4 = cell("nonspec", 4), cell("nonspec", 8), cell("spec", 4)


def _tokenization_share(s: Summaries) -> float:
    """Percent of nonspec's "other" time that is PRM input building (host_prm_task_s per task)."""
    x = s[NS4.name]
    return 100.0 * float(x["time_tokenization_s"]) / max(float(x["time_other_s"]), 1e-12)


def _prm_saturation(s: Summaries) -> float:
    """PRM tokens/s of a 2,048-token batch over that of an 8,192-token batch (64-token
    tasks on 512 cached tokens): near 1 once throughput has saturated at ~2k tokens."""
    return float(s[NS4.name]["prm_rate_2048_over_8192"])


def _row(figure: str) -> int:
    rows = paper_rows().index[paper_rows()["figure"] == figure]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} paper rows for {figure}: expected exactly one")
    return int(rows[0])


def _throughput(model: str, beam: int, policy: str) -> Target:
    """A Fig. 13 bar: the policy's output tok/s (the protocol's reading)."""
    v, r, src = paper("fig13", "output_tok_s", policy, beam, model)
    c = cell(policy, beam, model=model)
    return Target(f"Fig. 13 {model} beam {beam}: {policy} output tok/s", (c,), metric(c, THROUGHPUT), v, source=src,
                  unit="tok/s", csv_row=r, id=pid("fig13", model, beam, policy, "output_tok_s"))


def _nonspec_share(part: str, tol: float = 0.15) -> Target:
    v, r, src = paper("fig15", f"time_{part}_pct", "nonspec", 4)
    return Target(f"nonspec {part} share (Fig. 15)", (NS4,), share(NS4, f"time_{part}_s"), v, tol=tol, source=src,
                  unit="%", csv_row=r, id=pid("fig15", "qwen2.5-7b", 4, "nonspec", f"time_{part}_pct"))


def _nonspec_and_reviews() -> tuple[Target, ...]:
    """Nonspec's own numbers (each model's) and the paper's ranges (docs/paper.md): what a fit
    may use."""
    return (
        *(_throughput(m, b, "nonspec") for m, b in (("qwen2.5-7b", 4), ("qwen2.5-7b", 8), ("qwen2.5-3b", 8))),
        _nonspec_share("generation"), _nonspec_share("verification"), _nonspec_share("other", tol=0.3),
        Target("tokenization share of other", (NS4,), _tokenization_share, 40.0, tol=0.25,
               source="docs/paper.md §9 (Fig. 15: ~40% of other is tokenization)", unit="%",
               id="review/tokenization_share_of_other"),
        Target("PRM throughput saturates near 2,048 tokens", (NS4,), _prm_saturation, 0.85, rule="range", high=0.95,
               source="docs/paper.md §6.1 (PRM throughput saturates near 2,048 input tokens per batch)", unit="x",
               id="review/prm_saturation_near_2048"),
        Target("common tokens across siblings (T=0.8)", (NS4,),
               lambda s: 100.0 * float(s[NS4.name]["sibling_common_token_share"]), 25.0, rule="range", high=50.0,
               source="docs/paper.md §5.3 (25-50% common tokens at temperature 0.8)", unit="%", csv_row=_row("dedup"),
               id="review/sibling_common_token_share"),
        Target("naive speculation PRM invocations / nonspec", (SPEC4, NS4), ratio(SPEC4, NS4, "prm_invocations"),
               2.0, rule="range", high=3.0, unit="x",
               source="docs/paper.md §2.2 (2-3x the baseline's PRM invocations)",
               csv_row=_row("prm_batches"), id="review/spec_prm_invocations_ratio"),
    )


# ---------------------------------------------------------------------- the paper's other numbers
def _throughput_ratio(model: str, num: str, den: str, name: str) -> Target:
    v, r, src = paper("fig13_ratio", "throughput_ratio", num, 8, model, baseline=den)
    a, b = cell(num, 8, model=model), cell(den, 8, model=model)
    return Target(name, (a, b), ratio(a, b, THROUGHPUT), v, source=src, unit="x", csv_row=r,
                  id=pid("fig13_ratio", model, 8, f"{num}_vs_{den}", "throughput_ratio"), beside=speedup(a, b))


def _fig13() -> tuple[Target, ...]:
    bars = [_throughput(m, b, p) for m, b, policies in (
        ("qwen2.5-7b", 8, ("spec", "fasttts", "ep", "ep_cd", "full")), ("qwen2.5-7b", 4, ("full",)),
        ("qwen2.5-3b", 8, ("ep", "ep_cd", "full"))) for p in policies]
    ratios = [_throughput_ratio("qwen2.5-7b", "full", den, f"headline full / {den}, beam 8")
              for den in ("spec", "fasttts", "nonspec")]
    ratios.append(_throughput_ratio("qwen2.5-3b", "ep_cd", "ep", "qwen2.5-3b ep_cd / ep, beam 8"))
    return (*bars, *ratios)


def _fig15() -> tuple[Target, ...]:
    """Each policy's generation and verification time as % of nonspec's total time (beam 4)."""
    out = []
    for pol in ("spec", "ep_cd", "full"):
        c = cell(pol, 4)
        for part in ("generation", "verification"):
            v, r, src = paper("fig15", f"time_{part}_pct", pol, 4)
            out.append(Target(f"Fig. 15 {pol} {part} (% of nonspec time)", (c, NS4),
                              lambda s, c=c, part=part: 100.0 * _get(s, c, f"time_{part}_s") / _get(s, NS4, "makespan_s"),
                              v, source=src, unit="%", csv_row=r,
                              id=pid("fig15", "qwen2.5-7b", 4, pol, f"time_{part}_pct")))
    return tuple(out)


def _fig16() -> tuple[Target, ...]:
    """The Qwen2.5-3B MATH-500 study: LV at B_max 2,048 and 4,096 over EP+CD."""
    out = []
    for beam in (4, 8):
        base = cell("ep_cd", beam, model="qwen2.5-3b")
        at = {b: cell("full", beam, f"policy.b_max={b}", model="qwen2.5-3b") for b in (2048, 4096)}
        for b_max, relation, rule, name in ((2048, "~", "rel", f"Fig. 16 beam {beam}: LV at 2,048 / EP+CD"),
                                            (4096, "<", "below", f"Fig. 16 beam {beam}: LV at 4,096 / EP+CD below 1")):
            v, r, src = paper("fig16", "throughput_ratio", "full", beam, relation=relation)
            out.append(Target(name, (at[b_max], base), ratio(at[b_max], base, THROUGHPUT), v, rule=rule, source=src,
                              unit="x", csv_row=r, beside=speedup(at[b_max], base),
                              id=pid("fig16", "qwen2.5-3b", beam, f"full_bmax{b_max}_vs_ep_cd", "throughput_ratio")))
    return tuple(out)


def _beam32() -> tuple[Target, ...]:
    ns32, full32 = cell("nonspec", 32), cell("full", 32)
    out = []
    for pol, c in (("nonspec", ns32), ("full", full32)):
        v, r, src = paper("beam_scaling", "norm_latency_ms_per_tok", pol, 32)
        out.append(Target(f"beam 32 {pol} normalised latency", (c,), metric(c, LATENCY), v, source=src,
                          unit="ms/token", csv_row=r, id=pid("beam_scaling", "qwen2.5-7b", 32, pol,
                                                             "norm_latency_ms_per_tok")))
    v, r, src = paper("beam_scaling", "norm_latency_reduction_pct", "full", 32)
    out.append(Target("beam 32 full normalised latency below nonspec", (full32, ns32),
                      lambda s: 100.0 * (1.0 - _get(s, full32, LATENCY) / _get(s, ns32, LATENCY)), v, source=src,
                      unit="%", csv_row=r,
                      id=pid("beam_scaling", "qwen2.5-7b", 32, "full_vs_nonspec", "norm_latency_reduction_pct")))
    v, r, src = paper("beam_scaling", "kv_memory_reduction_pct", "full", 32)
    out.append(Target("beam 32 full KV peak below nonspec", (full32, ns32),
                      lambda s: 100.0 * (1.0 - _get(s, full32, "kv_peak_blocks") / _get(s, ns32, "kv_peak_blocks")),
                      v, source=src, unit="%", csv_row=r,
                      id=pid("beam_scaling", "qwen2.5-7b", 32, "full_vs_nonspec", "kv_memory_reduction_pct")))
    return tuple(out)


def _llama() -> Target:
    """The paper's Llama results (docs/paper.md §9): in some MATH and OlympiadBench
    configurations EP alone stays below the non-speculative baseline -> the lowest
    EP/nonspec over those < 1."""
    pairs = [(cell("ep", 4, model=m, dataset=d), cell("nonspec", 4, model=m, dataset=d))
             for m in ("llama3.2-3b", "llama3.1-8b") for d in ("math500", "olympiadbench")]
    return Target("Llama pairs: EP alone below nonspec in some MATH/Olympiad configuration",
                  tuple(c for p in pairs for c in p),
                  lambda s: min(_get(s, ep, THROUGHPUT) / _get(s, ns, THROUGHPUT) for ep, ns in pairs),
                  1.0, rule="below", unit="x", id="review/llama_ep_below_nonspec",
                  source="docs/paper.md §9 (Llama results: EP alone below nonspec in some MATH and Olympiad "
                         "configurations)")


def _serving_rate(cells: tuple[Cell, ...], rates: tuple[float, ...], level: float) -> Callable[[Summaries], float]:
    """The Poisson rate at which the normalised latency curve crosses ``level`` ms/token
    (analysis.fig_serving's reading): 0 when it starts above the level at the lowest
    rate, inf when it stays below it up to the highest."""
    from specscale.metrics.operating_points import rate_at_latency

    def measure(s: Summaries) -> float:
        lat = [_get(s, c, "norm_latency_ms_per_output_tok") for c in cells]
        rate, rel = rate_at_latency(np.asarray(rates), np.asarray(lat), level)
        return {"<": 0.0, ">": math.inf}.get(rel, rate)
    return measure


def _saturation(cells: tuple[Cell, ...], limits: tuple[int, ...]) -> Callable[[Summaries], float]:
    """The concurrency at which output tok/s saturates (analysis.fig_concurrency's
    reading); inf when it still rises at the largest limit tested."""
    from specscale.metrics.operating_points import saturation_point

    def measure(s: Summaries) -> float:
        c, rel = saturation_point(np.asarray(limits), np.asarray([_get(s, x, THROUGHPUT) for x in cells]))
        return math.inf if rel == ">=" else c
    return measure


def _operating_points() -> tuple[Target, ...]:
    """Serving knees (Poisson rate sweep at beam 4) and concurrency saturation (beam 4)."""
    out = []
    for pol in ("full", "fasttts"):
        v, r, src = paper("serving", "request_rate_req_s", pol, 4, "qwen2.5-7b")
        level = float(paper_rows().loc[r, "x_value"])
        cells = tuple(cell(pol, 4, f"workload.rate={x}", workload=PROTOCOL.serving_workload) for x in SERVING_RATES)
        out.append(Target(f"serving knee: {pol} req/s at {level:g} ms/token (beam 4)", cells,
                          _serving_rate(cells, SERVING_RATES, level), v, source=src, unit="req/s", csv_row=r,
                          id=pid("serving", "qwen2.5-7b", 4, pol, "request_rate_req_s")))
    for pol in ("nonspec", "fasttts", "full"):
        v, r, src = paper("concurrency", "saturation_concurrency", pol, 4)
        rel = str(paper_rows().loc[r, "relation"])
        # The default concurrency is the plain cell, shared with the other targets.
        cells = tuple(cell(pol, 4, *(() if c == PAPER_CONCURRENCY else (f"concurrency={c}",))) for c in CONCURRENCIES)
        out.append(Target(f"concurrency saturation: {pol} (beam 4)", cells, _saturation(cells, CONCURRENCIES), v,
                          rule="above" if rel == ">" else "rel", source=src, unit="requests", csv_row=r,
                          id=pid("concurrency", None, 4, pol, "saturation_concurrency")))
    return tuple(out)


# Paper figures whose rows are neither fitted nor held out, and why (kept explicit so a
# new row of the paper CSV cannot be silently ignored; a test checks every row is covered).
NOT_PRODUCED = {
    "table2": "accuracy: the synthetic workload's correctness follows dataset.sim's difficulty, set from the "
              "paper's accuracy, so predicting it would be circular",
}


# ---------------------------------------------------------------------- the protocol's sets
def _by_id(targets: Iterable[Target]) -> dict[str, Target]:
    out: dict[str, Target] = {}
    for t in targets:
        if not t.id or t.id in out:
            raise ProtocolError(f"target {t.name!r}: id {t.id!r} is empty or not unique")
        out[t.id] = t
    return out


def produced() -> dict[str, Target]:
    """Every target the sim can produce, by id, built once."""
    return _by_id((*_nonspec_and_reviews(), *_fig13(), *_fig15(), *_fig16(), *_beam32(), _llama(),
                   *_operating_points()))


def select(targets: Mapping[str, Target], name: str) -> tuple[Target, ...]:
    """The protocol's set ``name``, in the protocol's order (checked to cover ``targets``)."""
    PROTOCOL.check_covers(targets)
    return tuple(targets[i] for i in PROTOCOL.ids(name))


def check_fittable(targets: Iterable[Target]) -> tuple[Target, ...]:
    """The targets, if every one is in the protocol's calibrate set (ProtocolError otherwise)."""
    targets = tuple(targets)
    PROTOCOL.check_fittable(t.id for t in targets)
    return targets


TARGETS: dict[str, Target] = produced()
CALIBRATION: tuple[Target, ...] = select(TARGETS, "calibrate")
DEVELOP: tuple[Target, ...] = select(TARGETS, "develop")
SEALED: tuple[Target, ...] = select(TARGETS, "sealed")


def cells_of(targets) -> dict[str, Cell]:
    out: dict[str, Cell] = {}
    for t in targets:
        for c in t.cells:
            out.setdefault(c.name, c)
    return out
