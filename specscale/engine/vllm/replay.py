"""A vLLM run's own schedule, call by call, and the profiled cost model replayed over it.

The sim cannot rebuild a vLLM run's search tree (vLLM samples with its own sampler and
schedules with its own scheduler), so the fidelity check for vLLM replays vLLM's
schedule instead: every generation iteration and PRM batch a run made, with the features
vLLM reports for it (``specscale.engine.vllm.features``), its measured seconds and the
host gap after it (``specscale.engine.host_gaps``). A profile fitted on other vLLM runs
(``fit_profile``) then predicts each call's device seconds and host gap (``predict``);
summed over the schedule (plus the run's measured idle time) they give the predicted
generation / verification / other time and makespan. Trees: n/a, the prediction replays
vLLM's schedule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from specscale.engine.cost_profile import GEN_FEATURES, PRM_FEATURES, CostProfile, LinearCost
from specscale.engine.host_gaps import fit_host_model, host_gaps, predict_host

GEN_COLS = tuple(f"x_gen_{n}" for n in GEN_FEATURES)  # x_: the recorder has prm_tasks already
PRM_COLS = tuple(f"x_prm_{n}" for n in PRM_FEATURES)


def call_table(rec, gen_iterations: Sequence[Any], prm_batches: Sequence[Any]) -> pd.DataFrame:
    """``host_gaps`` of the run (its calls in time order, measured seconds and gap after
    each) with each call's cost features: ``x_gen_*`` on generation iterations, ``x_prm_*`` on
    PRM batches (0 on the other kind). ``gen_iterations`` / ``prm_batches``: the run's
    ``VLLMGeneration.iteration_features`` and its PRM engine's ``batches``, one per call."""
    df = host_gaps(rec.iterations, rec.makespan_s)
    gen, ver = (df["kind"] == "generate").to_numpy(), (df["kind"] == "verify").to_numpy()
    if gen.sum() != len(gen_iterations) or ver.sum() != len(prm_batches):
        raise ValueError(f"vLLM replay: the recorder has {gen.sum()} iterations and {ver.sum()} PRM batches, the "
                         f"engine reported {len(gen_iterations)} and {len(prm_batches)}")
    for cols, rows, calls in ((GEN_COLS, gen, gen_iterations), (PRM_COLS, ver, prm_batches)):
        X = np.zeros((len(df), len(cols)))
        if len(calls):
            # host_gaps sorts stably by start time: each kind keeps the order it was recorded in
            X[rows] = np.vstack([c.features() for c in calls])
        df = pd.concat([df, pd.DataFrame(X, columns=list(cols), index=df.index)], axis=1)
    return df


def fit_profile(tables: Sequence[pd.DataFrame], device: str, meta: Mapping[str, Any]) -> CostProfile:
    """The profile of vLLM fitted to its own calls: ``LinearCost`` (relative-error NNLS) to
    every generation iteration's and PRM batch's measured seconds, the host model to the
    gaps between calls (the runs must be saturated: an idle stretch would read as host
    work). Fitted inside the serving loop, so ``in_loop`` is 1."""
    t = pd.concat(tables, ignore_index=True)
    gen, prm = t[t["kind"] == "generate"], t[t["kind"] == "verify"]
    return CostProfile(device, LinearCost.fit(GEN_FEATURES, gen[list(GEN_COLS)].to_numpy(), gen["seconds"].to_numpy()),
                       LinearCost.fit(PRM_FEATURES, prm[list(PRM_COLS)].to_numpy(), prm["seconds"].to_numpy()),
                       fit_host_model(t), dict(meta), {"generation": 1.0, "prm": 1.0})


@dataclass(frozen=True)
class Replay:
    """One run's seconds, measured and as the profile predicts them over its schedule."""

    generation_s: float
    verification_s: float
    other_s: float  # host gaps after the calls
    makespan_s: float  # the three + the run's measured idle time
    extrapolated: int  # calls with a feature outside the profile's fitted range


def predict(profile: CostProfile, table: pd.DataFrame, idle_s: float) -> Replay:
    out, extrapolated = {}, 0
    for kind, lin, cols, factor in (("generate", profile.generation, GEN_COLS, profile.in_loop["generation"]),
                                    ("verify", profile.prm, PRM_COLS, profile.in_loop["prm"])):
        total = 0.0
        for x in table.loc[table["kind"] == kind, list(cols)].to_numpy():
            s, outside = lin.predict(x)
            total += s * factor
            extrapolated += outside
        out[kind] = total
    other = float(predict_host(profile.host, table).sum())
    return Replay(out["generate"], out["verify"], other, out["generate"] + out["verify"] + other + idle_s,
                  extrapolated)


def measured(summary: Mapping[str, Any]) -> Replay:
    """The run's own figures in the same terms (from its summary)."""
    return Replay(summary["time_generation_s"], summary["time_verification_s"], summary["time_other_s"],
                  summary["makespan_s"], 0)
