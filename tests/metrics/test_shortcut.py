"""A constructed case where the perfect-score shortcut changes the selection."""
from __future__ import annotations

import pandas as pd

from cfg_helpers import compose_cfg
from specscale.cell import build_server, run_cell
from specscale.metrics.shortcut import shortcut_divergence


def test_shortcut_changes_selection_and_rounds_parquet_says_so(tmp_path):
    # Every on-track step scores exactly 1.0, so most rounds hold more than K perfect
    # scores: the shortcut picks the earliest verified, the strict rule the lowest positions.
    common = ["beam=8", "expansion=4", "seed=21", "engine.synthetic.exact_one_share=1.0",
              "engine.synthetic.error_rate=0.0"]
    run_cell(compose_cfg("policy=ep", *common), tmp_path / "ep")
    run_cell(compose_cfg("policy=ep_strict", *common), tmp_path / "strict")
    ep = pd.read_parquet(tmp_path / "ep" / "rounds.parquet")
    strict = pd.read_parquet(tmp_path / "strict" / "rounds.parquet")
    assert set(ep["closed_by"]) <= {"all_scored", "shortcut"}
    assert (ep["closed_by"] == "shortcut").any()
    assert (strict["closed_by"] == "all_scored").all()
    div = shortcut_divergence(ep, strict)
    changed = div[div["selection_differs"]]
    assert len(changed) > 0
    assert (changed["closed_by"] == "shortcut").all()  # only the shortcut can change a selection
    # The strict run with the same seed picks positions 0..K-1 among the perfect scores.
    row = changed.iloc[0]
    s = strict[(strict.request_id == row.request_id) & (strict["round"] == row["round"])].iloc[0]
    keys = list(s.member_keys)
    assert sorted(keys.index(k) for k in s.selected_keys) == [0, 1]


def test_strict_policies_never_diverge():
    common = ["beam=8", "seed=22", "engine.synthetic.exact_one_share=1.0"]
    a = pd.DataFrame(build_server(compose_cfg("policy=ep_strict", *common)).run().rounds)
    b = pd.DataFrame(build_server(compose_cfg("policy=nonspec", *common)).run().rounds)
    div = shortcut_divergence(a, b)
    assert div["same_members"].all() and not div["selection_differs"].any()
