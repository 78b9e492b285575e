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
from specscale.engine.torch.config import ModelConfig
from specscale.engine.torch.model_configs import config_for


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


def test_host_overhead_benchmark_reduced(capsys):
    """Previous (from git) and current host paths side by side, on the same small data."""
    from runners import bench_host_overhead

    res = bench_host_overhead.main(["--rows", "8", "--context", "64", "--prm-tasks", "4", "--prm-tokens", "160",
                                    "--repeat", "1"])
    assert set(res) == {"decode batch + plan", "engine step (forward stubbed)", "  the same, sampler math stubbed",
                        "  of which sampler tensor math", "PRM new pieces (fresh steps)", "PRM batch preparation"}
    for by in res.values():
        assert set(by) == {"previous", "current"} and all(w > 0 and c >= 0 for w, c in by.values())
    out = capsys.readouterr().out
    assert "decode iteration, all on the CPU" in out and "decode host total (GPU sampler)" in out
    from specscale.engine import sampler
    assert sampler.draw.__name__ == "draw"  # the stub was put back


def test_host_overhead_paths_build_the_same_inputs():
    """The benchmark compares like with like: the previous and current PRM preparation give
    the same token ids and reward positions, the decode batches the same tensors."""
    import torch

    from runners import bench_host_overhead as b
    from specscale.engine.backend import GenBatch, GenRow
    from specscale.engine.torch import prm_paths
    from specscale.engine.torch.batch_builder import BatchBuilder

    legacy = b.Legacy.load(b.BASELINE)
    seqs, n_blocks = b.decode_sequences(6, 40)
    gen = GenBatch([GenRow(s, s.num_cached, 1, True) for s in seqs])
    old, _ = b.legacy_decode_batch(legacy, gen, n_blocks, 64, "cpu")
    from specscale.engine.torch.attention import make_attention_backend

    new, _ = b.current_decode_batch(BatchBuilder(b.BLOCK, torch.device("cpu")), gen, make_attention_backend("auto"))
    for name in ("input_ids", "positions", "slot_mapping", "context_lens", "block_tables", "cu_seqlens_q"):
        assert torch.equal(getattr(old, name), getattr(new, name)), name
    head, _, leaves = b.prm_tree(3, 120)
    closing = (b.VOCAB - 2,)
    prm = b.random_prm(512)
    like = type("Like", (), {"max_model_len": 512, "_max_model_len": 512, "config": prm.config, "kv_cache": None,
                             "block_size": None, "max_batch_tokens": prm.max_batch_tokens})()
    old_paths, new_paths = b.prm_paths(legacy.prm_paths, head, closing), b.prm_paths(prm_paths, head, closing)
    lv = leaves()
    olds = b.legacy_prm_prepare(legacy, old_paths, b.prm_items(old_paths, lv, closing), like)
    news = b.current_prm_prepare(new_paths, b.prm_items(new_paths, lv, closing), prm)
    assert len(olds) == len(news)
    for (ob, oi), chunk in zip(olds, news):
        assert torch.equal(ob.input_ids, chunk.batch.input_ids) and torch.equal(oi, chunk.reward_index)


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
