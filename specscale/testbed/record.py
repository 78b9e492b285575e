"""The testbed benchmark's record (``runners.bench_testbed --out DIR``), read by the
report's "Testbed" section (``analysis.testbed``) and by the workload fitter.

Small, long-format CSV files, one row per observation, so the report can recompute any
statistic (Wilson intervals, paired tests, goodput at any budget, AUC, calibration)
without rerunning a model:

* ``requests.csv``: one row per (policy, beam, problem): correct, latency, the cell's
  makespan, shortcut rounds;
* ``baselines.csv``: one row per problem: the sampling baselines at N (single, majority,
  PRM-weighted vote, PRM best-of-N, the mean per-sample accuracy) and its level;
* ``prm_steps.csv``: one row per scored step: source (``sampled``: the generator's own
  samples labelled by checking them; ``planted``: reference solutions with a planted
  error), path, step index, label (1 = this step and every one before it right),
  whether it is the path's first wrong step, and the PRM's p(+);
* ``bench.json``: the command, sizes and settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from specscale.testbed.prm_data import LabelledPath

FILES = ("requests.csv", "baselines.csv", "prm_steps.csv", "bench.json")


def step_rows(source: str, path_id: str, path: LabelledPath, scores: Sequence[float]) -> list[dict]:
    first = path.first_error
    return [{"source": source, "path": path_id, "step": i, "n_steps": len(path.steps), "label": int(y),
             "first_wrong": int(i == first), "score": float(s)}
            for i, (y, s) in enumerate(zip(path.labels, scores))]  # fmt: skip


def request_frame(rows: Sequence[dict], levels: dict[str, int]) -> pd.DataFrame:
    out = []
    for r in rows:
        for q in r["requests"]:
            out.append({"policy": r["policy"], "beam": r["beam"], "expansion": r["expansion"],
                        "problem_id": q["problem_id"], "level": levels.get(q["problem_id"]),
                        "correct": bool(q["correct"]), "correct_majority": bool(q["correct_majority"]),
                        "correct_best_single": bool(q["correct_best_single"]), "latency_s": q["latency_s"],
                        "output_tokens": q["output_tokens"], "shortcut_rounds": q.get("shortcut_rounds", 0),
                        "makespan_s": r["makespan_s"]})  # fmt: skip
    return pd.DataFrame(out)


def write(out: Path, rows: Sequence[dict], baselines: dict, steps: Sequence[dict], meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    base = pd.DataFrame(baselines)
    levels = dict(zip(base["problem_id"], base["level"]))
    paths = [out / f for f in FILES]
    request_frame(rows, levels).to_csv(paths[0], index=False, float_format="%.6g")
    base.to_csv(paths[1], index=False)
    pd.DataFrame(steps).to_csv(paths[2], index=False, float_format="%.6g")
    paths[3].write_text(json.dumps(meta, indent=1) + "\n")
    return paths
