"""Search traces of a simulated run, in the frame ``specscale.testbed.traces.member_frame``
builds from a testbed run: one row per round member (request, problem, round, key,
parent, sibling group, step tokens, score, terminal, on_track, parent_on_track, answer),
with the sim's true latent labels in place of the checker's. What the workload fitter
reads from the testbed, read from the sim, so the two can be compared statistic by
statistic (and the fitter checked on traces with known constants).
"""
from __future__ import annotations

from typing import Any

import pandas as pd


def sim_member_frame(server: Any) -> pd.DataFrame:
    """The members of every finished request of a sim ``server`` that has run (its
    searches keep their rounds); members that never finished their step are left out, as
    they are from the round records."""
    workload, problems = server.backend.workload, server.backend.problems
    rows = []
    for req in sorted(server.finished, key=lambda r: r.request_id):
        p = problems[req.request_id]
        for rd in req.search.rounds:
            for c in rd.members:
                if c.end_time is None:
                    continue
                path = c.path()
                parent = c.parent.key if c.parent is not None and c.parent.round >= 0 else None
                rows.append({"request_id": req.request_id, "problem_id": p.id, "level": 0, "round": c.round,
                             "key": c.key, "parent": parent, "group": (req.request_id, parent),
                             "tokens": list(c.step_tokens), "n_tokens": len(c.step_tokens), "score": c.score,
                             "terminal": c.terminal, "on_track": workload.on_track(path, p.difficulty, p.key),
                             "parent_on_track": parent is None or workload.on_track(path[:-1], p.difficulty, p.key),
                             "answer": server.backend.answer(c) if c.terminal else None})  # fmt: skip
    df = pd.DataFrame(rows)
    if len(df):  # object dtype: None beside 64-bit keys would make the column float
        df["parent"] = pd.Series([r["parent"] for r in rows], dtype=object)
    return df
