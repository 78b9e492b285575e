"""The GPU benchmarks' code paths, run on CPU at reduced size (their figures mean nothing
here; runners/gpu_check.sh runs them at real size on a GPU), and the roofline arithmetic."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from runners import bench_decode, bench_policies
from specscale.compose import CONF_DIR
from specscale.engine.sim.hardware import HardwareProfile
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.configs import config_for


def test_decode_roofline_of_qwen7b_by_hand():
    dims = bench_decode.model_dims(ModelConfig.from_dict(config_for("Qwen/Qwen2.5-7B-Instruct")))
    hw = HardwareProfile.from_config(yaml.safe_load((CONF_DIR / "hardware" / "h200.yaml").read_text()))
    # Per layer: q, o 3584x3584; k, v 3584x512; gate/up/down 3 x 3584x18944. Plus the
    # untied LM head 152064x3584. bf16. K/V: 28 layers x (K, V) x 4 heads x 128 x 2 bytes.
    weights = 2 * (28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944) + 152064 * 3584)
    kv = 64 * 512 * 28 * 2 * 4 * 128 * 2
    want = (weights + kv) / 4.8e12
    assert hw.hbm_bandwidth_bytes_s == pytest.approx(4.8e12)
    assert bench_decode.roofline_seconds(dims, hw, 64, 512, 2) == pytest.approx(want, rel=2e-3)


def test_decode_benchmark_times_eager_and_graphs(tmp_path):
    out = bench_decode.main(["--batch", "1,3", "--iters", "2", "--ctx", "40", "--graphs", "on",
                             "--json", str(tmp_path / "d.json")])
    assert out["graphs"] == "eager" and json.loads((tmp_path / "d.json").read_text()) == out
    for row in out["rows"]:
        assert row["ms_eager"] > 0 and row["ms_graphs"] > 0
        assert row["fraction"] == pytest.approx(row["roofline_ms"] / row["ms"])
    assert out["rows"][1]["batch"] == 3


def test_policy_benchmark_reduced(tmp_path):
    path = tmp_path / "p.json"
    rows = bench_policies.main(["--policies", "nonspec,full", "--n-problems", "2", "--beam", "4",
                                "--concurrency", "2", "--max-rounds", "3", "--graphs", "on", "--json", str(path)])
    assert json.loads(path.read_text()) == rows
    assert [r["policy"] for r in rows] == ["nonspec", "full"]
    assert rows[0]["ratio_to_nonspec"] == 1.0
    assert rows[1]["ratio_to_nonspec"] == pytest.approx(rows[1]["output_tok_s"] / rows[0]["output_tok_s"])
    assert rows[1]["makespan_ratio"] == pytest.approx(rows[0]["makespan_s"] / rows[1]["makespan_s"])
    assert rows[1]["logical_ratio"] == pytest.approx(rows[1]["throughput_tok_s"] / rows[0]["throughput_tok_s"])
    for r in rows:
        assert r["reduced"] and r["output_tok_s"] > 0 and r["leaked_blocks"] == 0
        assert r["time_other_s"] > 0  # host work is on the wall clock
        assert r["graph_replays"] > 0 and r["prm_invocations"] > 0


def test_gpu_check_report_gathers_step_outputs(tmp_path):
    from runners import gpu_check_report

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    (work / "env.json").write_text(json.dumps({"torch": "x", "flashinfer": False}))
    (work / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 580\n")
    rows = [{"batch": b, "fraction": f} for b, f in ((64, 0.5), (256, 0.75))]
    (work / "decode.json").write_text(json.dumps({"rows": rows}))
    (work / "policies.json").write_text(json.dumps([
        {"policy": "nonspec", "output_tok_s": 100.0, "ratio_to_nonspec": 1.0, "makespan_ratio": 1.0},
        {"policy": "full", "output_tok_s": 150.0, "ratio_to_nonspec": 1.5, "makespan_ratio": 1.4},
    ]))
    gpu_check_report.main(["summary", str(work), str(out), "--tests-rc", "0", "--seconds", "301"])
    fig = json.loads((out / "gpu_check.json").read_text())
    assert fig["gpu"].startswith("NVIDIA H200") and fig["seconds"] == 301 and fig["tests_rc"] == 0
    assert fig["decode_roofline_fraction"] == {"64": 0.5, "256": 0.75}
    assert fig["decode_flashinfer"] is None and fig["tests_flashinfer_rc"] is None
    text = "\n".join(gpu_check_report.headline(fig))
    assert "batch 64 0.500, batch 256 0.750" in text and "full" in text and "x nonspec 1.50" in text


def test_adaptive_control_cost_benchmark_reduced(capsys):
    from runners import bench_adaptive_control

    rows = bench_adaptive_control.main(["--cells", "4x4", "--problems", "4", "--repeat", "1"])
    (r,) = rows
    assert r["decisions"] > 0 and 0 < r["control_us_per_iter"] and 0 < r["scheduler_us_per_iter"]
    assert r["control_pct_of_scheduler"] == pytest.approx(100 * r["control_us_per_iter"] / r["scheduler_us_per_iter"])
    assert "control_pct_of_scheduler" in capsys.readouterr().out


HOST_TINY = ["--rows", "8", "--context", "64", "--prm-tasks", "4", "--prm-tokens", "160", "--repeat", "1"]


def test_host_overhead_benchmark_reduced(capsys, tmp_path):
    """Current host paths on small data, against a baseline stored by the run before."""
    from runners import bench_host_overhead

    res = bench_host_overhead.main([*HOST_TINY, "--baseline-dir", str(tmp_path), "--save-baseline"])
    assert set(res) == {"decode batch + plan", "engine step (forward stubbed)", "  the same, sampler math stubbed",
                        "  of which sampler tensor math", "PRM new pieces (fresh steps)", "PRM batch preparation"}
    assert all(w > 0 and c >= 0 for w, c in res.values())
    out = capsys.readouterr().out
    assert "no stored baseline" in out and (tmp_path / "bench_host_overhead.json").exists()
    assert "decode iteration, all on the CPU" in out and "decode host total (GPU sampler)" in out
    from specscale.engine import sampler
    assert sampler.draw.__name__ == "draw"  # the stub was put back

    bench_host_overhead.main([*HOST_TINY, "--baseline-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "baseline: bench_host_overhead.json" in out and "no stored baseline" not in out
    decode_line = next(line for line in out.splitlines() if line.startswith("decode batch + plan"))
    assert "-" not in decode_line.split("plan", 1)[1]  # every cell filled, the speed-up too


def test_host_overhead_table_without_a_baseline(capsys, tmp_path):
    from argparse import Namespace

    from runners import bench_baseline, bench_host_overhead

    args = Namespace(
        repeat=1, device="cpu", rows=8, context=64, prm_tasks=4, prm_tokens=160, no_baseline=False,
        baseline_dir=tmp_path / "absent")
    comparison = bench_baseline.compare_with_stored("bench_host_overhead", args, {}, None)
    results = {row: (1e-3, 1e-3) for row in ("decode batch + plan", "engine step (forward stubbed)",
                                             "  the same, sampler math stubbed", "  of which sampler tensor math",
                                             "PRM new pieces (fresh steps)", "PRM batch preparation")}
    bench_host_overhead.print_table(args, results, comparison)
    out = capsys.readouterr().out
    assert "no stored baseline" in out and "PRM batch host total" in out


def test_torch_engine_benchmark_reduced(capsys, tmp_path):
    """Ours and transformers on a tiny size, then the same against the baseline just stored."""
    from runners import bench_torch_engine

    argv = ["--sizes", "2x8x4", "--repeat", "1", "--no-vllm", "--baseline-dir", str(tmp_path)]
    (row,) = bench_torch_engine.main([*argv, "--save-baseline"])
    assert row["size"] == "2x8x4" and row["ours"] > 0 and row["hf"] > 0 and row["baseline"] is None
    assert "no stored baseline" in capsys.readouterr().out
    stored = json.loads((tmp_path / "bench_torch_engine.json").read_text())
    assert stored["figures"]["2x8x4"]["throughput"] == {"value": row["ours"], "unit": "tokens/s"}

    (again,) = bench_torch_engine.main(argv)
    assert again["baseline"] == row["ours"]
    out = capsys.readouterr().out
    assert "baseline: bench_torch_engine.json" in out and "ours/base" in out


def test_torch_engine_summary_without_a_baseline(capsys, tmp_path):
    from argparse import Namespace

    from runners import bench_baseline, bench_torch_engine

    args = Namespace(repeat=1, threads=1, fused_ops=False, cpu_kernel=False, no_baseline=False,
                     baseline_dir=tmp_path)
    comparison = bench_baseline.compare_with_stored("bench_torch_engine", args, {}, None)
    bench_torch_engine.print_summary(args, [{"size": "2x8x4", "ours": 100.0, "hf": 50.0, "baseline": None}],
                                     comparison)
    out = capsys.readouterr().out
    assert "no stored baseline" in out and "2x8x4" in out


def test_no_baseline_skips_the_comparison(capsys, tmp_path):
    from runners import bench_host_overhead

    bench_host_overhead.main([*HOST_TINY, "--baseline-dir", str(tmp_path), "--no-baseline"])
    assert "comparison skipped" in capsys.readouterr().out


def _baseline(**machine):
    from runners.bench_baseline import Baseline, Machine

    here = {"cpu": "Some CPU", "cores": 2, "torch": "2.0", "python": "3.11.7", "probe_ms": 1.0, **machine}
    return Baseline(benchmark="bench_x", command="python -m runners.bench_x --repeat 1", commit="abc1234",
                    date="2024-01-01T00:00:00+00:00", machine=Machine(**here),
                    figures={"row": {"wall": {"value": 1.5, "unit": "ms"}}}, settings={"repeat": 1}, note="seeded")


def test_baseline_round_trips(tmp_path):
    from runners.bench_baseline import load_baseline, save_baseline

    base = _baseline()
    path = save_baseline(base, tmp_path)
    assert path == tmp_path / "bench_x.json" and [p.name for p in tmp_path.iterdir()] == ["bench_x.json"]
    loaded = load_baseline("bench_x", tmp_path)
    assert loaded == base and loaded.value("row", "wall") == 1.5 and loaded.value("row", "cpu") is None
    assert load_baseline("bench_y", tmp_path) is None


def test_a_baseline_saved_without_git_says_so(tmp_path):
    """On a copy of the tree with no history (a device machine) the commit is unknown, no error."""
    from runners.bench_baseline import current_commit

    assert current_commit(tmp_path) == "unknown"


def test_machine_mismatch_warns(tmp_path):
    from runners.bench_baseline import Machine, machine_warning

    stored = _baseline().machine
    assert machine_warning(stored, stored) is None
    assert machine_warning(stored, Machine(**{**vars(stored), "probe_ms": 1.05})) is None  # within 10%
    assert "2 cores there, 4 here" in machine_warning(stored, Machine(**{**vars(stored), "cores": 4}))
    assert "Other CPU" in machine_warning(stored, Machine(**{**vars(stored), "cpu": "Other CPU"}))
    assert "probe" in machine_warning(stored, Machine(**{**vars(stored), "probe_ms": 1.2}))


def test_a_doctored_baseline_is_flagged_above_the_table(capsys, tmp_path):
    """A stored baseline from another machine (here: other core count and CPU model) says so."""
    from argparse import Namespace

    from runners.bench_baseline import Machine, compare_with_stored, save_baseline

    here = Machine.here()
    save_baseline(_baseline(cpu=here.cpu + " (another)", cores=here.cores + 6, probe_ms=here.probe_ms), tmp_path)
    args = Namespace(no_baseline=False, baseline_dir=tmp_path)
    comparison = compare_with_stored("bench_x", args, {"repeat": 1}, here)
    warnings = [line for line in comparison.header if line.startswith("WARNING")]
    assert len(warnings) == 1 and f"{here.cores + 6} cores there" in warnings[0] and "(another)" in warnings[0]
    assert comparison.value("row", "wall") == 1.5
    other_settings = compare_with_stored("bench_x", args, {"repeat": 5}, here)
    assert any("other settings" in line for line in other_settings.header)


def test_stored_baselines_are_complete():
    """The committed baselines carry their provenance and figures with units."""
    from runners.bench_baseline import DEFAULT_DIR, load_baseline

    for name in ("bench_torch_engine", "bench_host_overhead"):
        base = load_baseline(name, DEFAULT_DIR)
        assert base is not None, name
        assert base.command.startswith("python -m runners." + name) and base.commit and base.date and base.note
        assert base.machine.cpu and base.machine.cores > 0 and base.machine.probe_ms > 0
        assert base.figures and all(f["unit"] and f["value"] > 0 for row in base.figures.values()
                                    for f in row.values())


def test_decode_split_covers_each_part_and_restores_the_engine():
    import torch.nn.functional as F

    from runners.bench_torch_engine import build_backend, random_prompts, run_ours
    from runners.decode_split import PARTS, decode_split
    from specscale.engine import sampler

    backend, _ = build_backend("qwen2_h64", torch.float32, num_blocks=64)
    prompts = random_prompts(4, 8, backend.vocab_size)
    linear, draw, ops = F.linear, sampler.draw, backend.runner.model.model.hot_ops
    parts = decode_split(backend, lambda b, step_hook: run_ours(b, prompts, 6, step_hook=step_hook))
    for part in PARTS:  # every part was called and timed in the decode iterations
        assert parts[part] > 0, part
    assert parts["step"] > parts["linear layers"] + parts["attention"]
    # the engine is as it was: no wrapper left behind
    assert F.linear is linear and sampler.draw is draw and backend.runner.model.model.hot_ops is ops
    assert "forward" not in vars(backend.runner.backend)
    seconds, _ = run_ours(backend, prompts, 6)
    assert seconds > 0
