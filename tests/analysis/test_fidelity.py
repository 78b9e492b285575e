"""analysis.fidelity on a CI-sized grid: same trees on torch (synthetic tokens) and the
sim on a profile, every column filled, the last line in its stated form."""
from __future__ import annotations

import re

import pandas as pd
import pytest
import torch
import yaml

from analysis import fidelity


def test_small_grid(tmp_path, capsys):
    from cost_profiles import analytic_profile  # noqa: E402 - a profile from a known cost function

    prof = tmp_path / "p.yaml"
    profile = analytic_profile().as_dict()
    # The speed probes' times when profiled (a made-up machine) and the pair they ran on.
    profile["meta"].update(probe_s=0.01, host_probe_s=0.02, overrides=["model=tiny"])
    prof.write_text(yaml.safe_dump({"name": "profiled:test", "memory_gb": 80, "hbm_bandwidth_tb_s": 2.0,
                                    "bf16_tflops": 300, "profile": profile}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = fidelity.main(["--profile", str(prof), "--policies", "nonspec,spec", "--beams", "4",
                            "--concurrency", "2", "--workloads", "saturated,poisson", "--reps", "1",
                            "--n-problems", "2", "--rescale-to-probe", "--results-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    df = pd.read_csv(tmp_path / "fidelity" / "fidelity.csv")
    assert len(df) == 4 and df["trees_identical"].all()
    per_trigger = [c for c in df.columns if c.startswith("verify_s:")]  # NaN where a trigger did not fire
    assert {"verify_s:barrier_measured", "verify_s:immediate_measured"} <= set(per_trigger)
    assert not df.drop(columns=["cost_model_extrapolated", *per_trigger]).isna().any().any()
    assert (df["probe_ratio"] > 0).all()  # this machine's probe time over the profile's 10 ms
    # The speed-adjusted error reads each saturated run (no idle time) at the profiled speed:
    # measured / probe ratio.
    sat = df[df["cell"].str.contains("workload=saturated")]
    adj = sat["makespan_s_predicted"] / (sat["makespan_s_measured"] / sat["probe_ratio"]) - 1
    assert sat["makespan_s_rel_error_speed_adjusted"].to_numpy() == pytest.approx(adj.to_numpy(), rel=1e-9)
    # Rescaled to this machine's probe: the prediction times the device ratio (host terms: none here).
    # (saturated: the same schedule at any speed; a Poisson cell's batches depend on arrival times).
    assert (df["rescale_device_ratio"] > 0).all() and (df["rescale_host_ratio"] > 0).all()
    gen = sat["time_generation_s_predicted_rescaled"] / sat["time_generation_s_predicted"]
    assert gen.to_numpy() == pytest.approx(sat["rescale_device_ratio"].to_numpy(), rel=1e-9)
    lines = capsys.readouterr().out.strip().splitlines()
    last = lines[-1]
    assert any(line.startswith("  PRM batches by trigger barrier: 2 cells, verification seconds error median")
               for line in lines)  # nonspec's batches: one trigger kind, its error read on its own
    # Saturated and Poisson cells apart: one line each, and the headline splits them too.
    lines = [line for line in lines if not line.startswith("  PRM batches by trigger")]
    assert lines[-3].startswith("  poisson: 2 cells, makespan error median") and "busy (idle < 10%" in lines[-3]
    assert lines[-2].startswith("  saturated: 2 cells, makespan error median") and "rescaled" in lines[-2]
    assert re.fullmatch(r"fidelity: 4 cells \(poisson 2: median makespan error [\d.]+%, max [\d.]+%; saturated 2: "
                        r"median makespan error [\d.]+%, max [\d.]+%\), trees identical 4/4", last)
    errors = pd.read_csv(tmp_path / "fidelity" / "fidelity_errors.csv")
    assert list(errors["metric"]) == list(fidelity.METRICS) and (errors["median_abs_error"] >= 0).all()
    ratios = pd.read_csv(tmp_path / "fidelity" / "fidelity_ratios.csv")
    assert set(ratios["policy"]) == {"nonspec", "spec"} and ratios["paired"].all()
    assert "policy ratios to nonspec within 3%: " in lines[-2] and "paired by repetition" in lines[-2]
    sec = fidelity.build_section(tmp_path, tmp_path / "report")
    assert [t[0].split()[0] for t in sec.tables] == ["Makespan", "Error", "Each"] and last in sec.notes
    assert any(n.startswith("  saturated: 2 cells, makespan error median") for n in sec.notes)
    assert any(n.startswith("  poisson: 2 cells, makespan error median") for n in sec.notes)


def test_the_pressure_cells_are_where_waiting_has_its_price():
    import argparse

    args = argparse.Namespace(beams=None, concurrency=None, n_problems=None, shapes=fidelity.SHAPES,
                              workloads="saturated", policies="nonspec", pressure=True)
    grid = fidelity.torch_grid(args)
    pressure = [(ctx, pol, cell) for ctx, pol, cell in grid if ctx.startswith("pressure:")]
    assert len(grid) == 6 + len(pressure) and {pol for _, pol, _ in pressure} == {"nonspec", "full"}
    flat = [" ".join(cell) for _, _, cell in pressure]
    for switch in ("engine.kv_blocks=110", "engine.max_num_seqs=8", "policy.b_max=128", "policy.d_max=1"):
        assert any(switch in c for c in flat), switch
    shapes = {tuple(c[1:5]) for _, _, c in grid[:6]}
    assert {"expansion=2", "expansion=4"} <= {c[1] for c in shapes}  # the widened grid: both expansions
    df = pd.DataFrame({"cell": [" ".join(c) for _, _, c in grid], "context": [ctx for ctx, _, _ in grid]})
    kinds = fidelity.workload_kind(df)
    assert (kinds[df["context"].str.startswith("pressure:")] == "pressure").all()
    assert (kinds[~df["context"].str.startswith("pressure:")] == "saturated").all()


def test_measured_policy_ratios_pair_runs_of_the_same_repetition():
    from analysis.fidelity_tables import policy_ratios, runs_column

    # spec's last two runs met a slow stretch that nonspec's first two missed: the ratio of
    # medians reads 2.2, the runs paired by repetition read spec's true 1.1.
    df = pd.DataFrame({"context": ["c", "c"], "policy": ["nonspec", "spec"],
                       "makespan_s_measured": [1.0, 2.2], "makespan_s_predicted": [1.0, 1.1],
                       "makespan_s_runs": [runs_column([1.0, 1.0, 2.0]), runs_column([1.1, 2.2, 2.2])]})
    spec = policy_ratios(df).set_index("policy").loc["spec"]
    assert spec["paired"] and spec["measured_vs_nonspec"] == pytest.approx(1.1) and abs(spec["rel_error"]) < 1e-9
    unpaired = policy_ratios(df.drop(columns="makespan_s_runs")).set_index("policy").loc["spec"]
    assert not unpaired["paired"] and unpaired["measured_vs_nonspec"] == pytest.approx(2.2)
