"""The host model fitted to gaps between device calls recovers the host work that made them."""
from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from cost_profiles import analytic_profile
from specscale.cell import build_server
from specscale.engine.host_gaps import fit_host_model, host_gaps, predict_host
from specscale.metrics.summary import summarize
from specscale.clock import HostCostModel

KNOWN = HostCostModel(iteration_s=3e-4, prm_task_s=4e-5, decode_row_s=2e-6, prefill_token_s=5e-7, draw_s=1.5e-6,
                      step_end_s=1.2e-5, fork_s=8e-6, prm_batch_s=2e-4, prm_token_s=3e-7)


def sim_run(policy: str, beam: int):
    """A sim run whose only host work is ``KNOWN`` (a profile's host model), charged per call."""
    cfg = compose_cfg(f"policy={policy}", f"beam={beam}", "n_problems=6")
    profile = analytic_profile().as_dict()
    profile["host"] = asdict(KNOWN)
    cfg["hardware"]["profile"] = profile
    return build_server(cfg).run()


def test_gaps_sum_to_other_time_and_the_fit_recovers_the_host_model():
    gaps = []
    for policy, beam in (("nonspec", 4), ("spec", 8), ("full", 8), ("ep_cd", 12)):
        rec = sim_run(policy, beam)
        g = host_gaps(rec.iterations, rec.makespan_s)
        assert g["gap_s"].sum() == pytest.approx(summarize(rec, [60], 1)["time_other_s"], rel=1e-9)
        gaps.append(g)
    g = pd.concat(gaps, ignore_index=True)
    fitted = fit_host_model(g)
    assert predict_host(fitted, g).to_numpy() == pytest.approx(g["gap_s"].to_numpy(), rel=1e-6, abs=1e-12)
    # Terms whose feature varies independently enough are recovered one by one.
    for term in ("iteration_s", "draw_s", "step_end_s", "prm_batch_s", "prm_task_s"):
        assert getattr(fitted, term) == pytest.approx(getattr(KNOWN, term), rel=0.02), term


def test_too_few_calls_cannot_fit():
    rows = pd.DataFrame([{"kind": "generate", "t_start": 0.0, "seconds": 0.1, "decode_rows": 1, "prefill_tokens": 0,
                          "logical_draws": 1, "steps_finished": 0, "forks": 0}])
    with pytest.raises(ValueError, match="cannot fit"):
        fit_host_model(host_gaps(rows.to_dict("records"), 0.2))
