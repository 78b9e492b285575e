"""Contexts, variants, dedupe and baselines on hand-made rows."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import cells as C

DEFAULTS = {"full": {"policy_verification": "lazy", "policy_b_max": 2048, "policy_d_max": 6},
            "ep_cd": {"policy_verification": "immediate", "policy_b_max": 2048, "policy_d_max": 6}}


def test_variant_labels():
    full = {"policy": "full", "policy_verification": "lazy", "policy_b_max": 2048, "policy_d_max": 6}
    assert C.variant_label(full, DEFAULTS) == ""
    assert C.variant_label({**full, "policy_b_max": 512.0}, DEFAULTS) == "b_max=512"
    assert C.variant_label({**full, "policy_b_max": 512, "policy_d_max": 4}, DEFAULTS) == "b_max=512,d_max=4"
    # A switch the policy's mode ignores (b_max without lazy verification) is no variant,
    # and a switch the store blanked (None) matches.
    ep_cd = {"policy": "ep_cd", "policy_verification": "immediate", "policy_b_max": 512, "policy_d_max": None}
    assert C.variant_label(ep_cd, DEFAULTS) == ""
    assert C.variant_label({**full, "policy_b_max": None}, DEFAULTS) == ""


def test_repository_policy_defaults_are_read():
    d = C.policy_defaults()
    assert d["full"]["policy_verification"] == "lazy" and d["full"]["policy_b_max"] == 2048


def frame(rows):
    base = {"model": "qwen2.5-7b", "dataset": "math500", "workload": "saturated", "rate": None, "beam": 4,
            "status": "ok", "cell_dir": "x"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_prepare_dedupes_identical_cells_and_keeps_variants():
    df = frame([{"policy": "ep_cd", "policy_verification": "immediate", "policy_b_max": b, "seed": 0,
                 "throughput_tok_s": 1.0} for b in (256, 512, 2048)]
               + [{"policy": "full", "policy_verification": "lazy", "policy_b_max": b, "seed": 0,
                   "throughput_tok_s": 2.0} for b in (256, 2048)]
               + [{"policy": "full", "policy_verification": "lazy", "policy_b_max": 2048, "seed": 0, "status": "failed"}])
    got = C.prepare(df, DEFAULTS)
    assert sorted(got["variant"]) == ["", "", "b_max=256"]
    assert got["policy"].tolist().count("ep_cd") == 1


def test_relative_to_pairs_by_seed_and_context():
    df = frame([{"policy": "nonspec", "seed": 0, "throughput_tok_s": 100.0},
                {"policy": "nonspec", "seed": 1, "throughput_tok_s": 200.0},
                {"policy": "full", "seed": 0, "throughput_tok_s": 150.0},
                {"policy": "full", "seed": 1, "throughput_tok_s": 220.0},
                {"policy": "full", "seed": 2, "throughput_tok_s": 999.0},
                {"policy": "full", "seed": 0, "throughput_tok_s": 50.0, "beam": 8}])
    rel = C.relative_to(df, "throughput_tok_s", df[df["policy"] == "nonspec"],
                        C.context_columns(df) + ["seed"])["rel"].tolist()
    assert rel[:4] == [1.0, 1.0, 1.5, 1.1]
    assert math.isnan(rel[4]) and math.isnan(rel[5])  # no baseline for that seed / beam


def test_seed_summary_uses_the_t_interval():
    s = C.seed_summary([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["n_seeds"] == 3
    assert s["ci_low"] == pytest.approx(-0.4841, abs=1e-4)
    one = C.seed_summary([4.0])
    assert one["mean"] == 4.0 and math.isnan(one["ci_low"])


def test_group_by_keeps_nan_keys():
    df = frame([{"policy": "a", "seed": 0}, {"policy": "a", "seed": 1}, {"policy": "b", "seed": 0}])
    groups = C.group_by(df, ["rate", "policy"])
    assert [len(g) for _, g in groups] == [2, 1]
    assert C.varying_columns(df, ["rate", "policy", "model"]) == ["policy"]
