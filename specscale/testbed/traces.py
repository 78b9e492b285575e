"""Search traces of the testbed, labelled: every round member of a real search with its
parent, tokens, PRM score and whether its path is still right.

The source is a run's round records (``rec.rounds``: member keys, step tokens, scores,
terminal flags, the selected parents) and requests; lineage is rebuilt from the keys
(round 0 = the root's children, round r+1 = the children of round r's selected members,
``hashing.child_key``), and a step is checked against the problem's reference solution,
which is unique in this format (``evaluate.label_steps``' rule: right when it and every
step before it match the reference).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from specscale.data.arith import parse_question
from specscale.data.prompts import STEP_DELIMITER
from specscale.hashing import MASK64, child_key, root_key
from specscale.grading import extract_boxed


def member_frame(rounds: Sequence[dict], requests: Sequence[dict], questions: Mapping[str, str], decode,
                 seed: int, beam: int, expansion: int) -> pd.DataFrame:  # fmt: skip
    """One row per round member: request, problem, level, round, key, parent (None in
    round 0), sibling group, tokens, step text, score, terminal, on_track (this step and
    every earlier one right), parent_on_track, and the answer of a terminal member."""
    req = {r["request_id"]: r for r in requests}
    ref_steps, rows = {}, []
    by_request: dict[int, list[dict]] = {}
    for rd in rounds:
        by_request.setdefault(rd["request_id"], []).append(rd)
    for rid, rds in by_request.items():
        pid = req[rid]["problem_id"]
        problem = parse_question(questions[pid])
        ref = ref_steps.setdefault(pid, problem.steps())
        parent_of = {child_key(root_key(seed, rid), j): None for j in range(beam)}
        on_track: dict[int, bool] = {}
        for rd in sorted(rds, key=lambda d: d["round"]):
            for key, toks, score, term in zip(rd["member_keys"], rd["member_texts"], rd["member_scores"],
                                              rd["member_terminal"]):  # fmt: skip
                key = int(key) & MASK64
                parent = parent_of.get(key)
                text = decode(list(toks))
                step = text.replace(STEP_DELIMITER, "").strip()
                parent_ok = True if parent is None else on_track[parent]
                ok = parent_ok and rd["round"] < len(ref) and step == ref[rd["round"]]
                on_track[key] = ok
                rows.append({"request_id": rid, "problem_id": pid, "level": len(problem.ops), "round": rd["round"],
                             "key": key, "parent": parent, "group": (rid, parent), "tokens": list(toks),
                             "n_tokens": len(toks), "text": step, "score": score, "terminal": bool(term),
                             "on_track": ok, "parent_on_track": parent_ok,
                             "answer": extract_boxed(text) if term else None})  # fmt: skip
            for sel in rd["selected_keys"]:
                sel = int(sel) & MASK64
                for j in range(expansion):
                    parent_of[child_key(sel, j)] = sel
    df = pd.DataFrame(rows)
    # object dtype: None beside 64-bit keys would make the column float and round the keys
    df["parent"] = pd.Series([r["parent"] for r in rows], dtype=object)
    return df
