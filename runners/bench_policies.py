"""Policy throughput on real-size random weights in synthetic-token mode (engine=torch).

    python -m runners.bench_policies [--model qwen2.5-7b] [--policies nonspec,spec,ep_cd,full]
        [--beam 8] [--concurrency 32] [--n-problems 16] [--hardware h200] [--reduced]
        [--attention auto] [--json OUT]

Both models of the pair (generator and PRM) run real forward passes on random weights
built from their stored config.json (``model.load_format=random``); tokens, step
lengths and PRM scores come from the sim's synthetic workload (``engine.synthetic_tokens``),
so the measured cost is the engine's under a controlled, paper-like workload. The models
are loaded once and reused by every policy's cell (same KV pool; decode graphs stay
captured). Each policy's row is written to ``--json`` as soon as it finishes, so a run cut
short keeps what it measured. Printed: output tokens/s (the paper's metric, docs/design.md §5) with
its ratio to nonspec, the makespan ratio and the logical-token ratio side by side (the
shortcut policies produce fewer logical tokens, so only the first two are time ratios),
normalised latency, the time breakdown, PRM invocations and input tokens per logical
token, decode-graph replays and wall time. ``--set engine.prm_prefix_cache=false`` runs
the PRM without its prefix cache.

``--reduced`` (default on CPU) keeps each architecture at hidden 64, 2 layers, so the
script runs anywhere; its figures are then a smoke test only.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import yaml

from specscale.cell import run_cell
from specscale.settings import CellSpec
from specscale.compose import CONF_DIR, compose_config
from specscale.engine.torch import build as torch_build
from specscale.engine.torch.model.configs import config_for, reduced

SHOWN = ("output_tok_s", "throughput_tok_s", "decoded_tok_s", "norm_latency_ms_per_output_tok",
         "norm_latency_ms_per_tok", "makespan_s", "time_generation_s", "time_verification_s", "time_other_s",
         "prm_invocations", "prm_tokens", "prm_tokens_per_logical_token", "physical_logical_ratio", "accuracy",
         "leaked_blocks", "kv_blocks_total", "prm_kv_blocks_total", "output_tokens", "logical_tokens")


def reduced_pair(model: str, into: Path) -> list[str]:
    """Overrides pointing the pair's checkpoints at reduced copies of their config.json."""
    pair = yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text())
    out = []
    for role in ("generator", "prm"):
        d = into / role
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(reduced(config_for(pair[role]["hf_name"]))))
        out.append(f"model.{role}.hf_name={d}")
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-7b", help="conf/model pair")
    ap.add_argument("--policies", default="nonspec,spec,ep_cd,full")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--n-problems", type=int, default=16)
    ap.add_argument("--max-rounds", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dataset", default="math500", help="conf/dataset (its synthetic problem profile)")
    ap.add_argument("--hardware", default="h200", help="conf/hardware (recorded; the torch engine measures)")
    ap.add_argument("--attention", default="auto", help="auto | torch | flashinfer")
    ap.add_argument("--graphs", default="auto", choices=["auto", "on", "off"],
                    help="decode graphs (auto: CUDA graphs on CUDA; on: on CPU the same path without capture)")
    ap.add_argument("--reduced", action="store_true", help="hidden 64, 2 layers (default on CPU)")
    ap.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    ap.add_argument("--json", default=None, help="write the rows here (after every policy)")
    args = ap.parse_args(argv)

    cuda = torch.cuda.is_available()
    reduce = args.reduced or not cuda
    tmp = tempfile.TemporaryDirectory(prefix="specscale-reduced-")
    base = [
        "engine=torch", "engine.synthetic_tokens=true", f"model={args.model}", "model.load_format=random",
        f"hardware={args.hardware}", f"dataset={args.dataset}", f"beam={args.beam}",
        f"concurrency={args.concurrency}", f"n_problems={args.n_problems}", f"seed={args.seed}",
        "progress=false", "wandb.mode=disabled", f"search.max_rounds={args.max_rounds}",
        f"engine.attention={args.attention}", f"engine.cuda_graphs={args.graphs != 'off'}",
        *(reduced_pair(args.model, Path(tmp.name)) if reduce else []),
        *(["engine.dtype=float32"] if not cuda else []),
        *args.set,
    ]
    policies = args.policies.split(",")
    t0 = time.perf_counter()
    models = torch_build.build_models(compose_config([*base, f"policy={policies[0]}"], resolve=True))
    runner = models[0]
    if args.graphs == "on" and not cuda:  # the same fixed-shape decode path, without capture
        runner.enable_decode_graphs(max_batch=256, replay="eager")
    load_s = time.perf_counter() - t0
    print(f"policies: {args.model}{' (reduced)' if reduce else ''} random weights, synthetic tokens, "
          f"{runner.dtype} on {runner.device}, attention {runner.backend.name}, "
          f"graphs {runner.graphs.replay_mode if runner.graphs else None}; models built in {load_s:.1f} s")
    rows: list[dict] = []
    for policy in policies:
        spec = CellSpec.from_config(compose_config([*base, f"policy={policy}"], resolve=True))
        graphs = runner.graphs
        before = (graphs.replays, graphs.num_captured, graphs.capture_seconds) if graphs else (0, 0, 0.0)
        t = time.perf_counter()
        summary = run_cell(spec, built=torch_build.build_torch(spec, models=models))
        after = (graphs.replays, graphs.num_captured, graphs.capture_seconds) if graphs else (0, 0, 0.0)
        rows.append({
            "policy": policy, **{k: summary.get(k) for k in SHOWN}, "wall_s": time.perf_counter() - t,
            "attention": runner.backend.name, "graph_replays": after[0] - before[0],
            "graphs_captured": after[1] - before[1], "graph_capture_s": after[2] - before[2],
            "model": args.model, "reduced": reduce, "beam": args.beam, "concurrency": args.concurrency,
            "n_problems": args.n_problems, "device": str(runner.device), "model_build_s": load_s,
        })
        add_ratios(rows)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print_row(rows[-1], header=len(rows) == 1)
    if len(rows) > 1 and rows[0]["ratio_to_nonspec"] is not None:
        print("x nonspec (output tok/s): " + ", ".join(f"{r['policy']} {r['ratio_to_nonspec']:.2f}" for r in rows))
        print("x nonspec (makespan):     " + ", ".join(f"{r['policy']} {r['makespan_ratio']:.2f}" for r in rows))
        print("x nonspec (logical tok/s): " + ", ".join(f"{r['policy']} {r['logical_ratio']:.2f}" for r in rows))
    tmp.cleanup()
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Each row against nonspec on the same problems: output-token throughput (the paper's
    metric), makespan (nonspec's / this one's: > 1 is faster) and logical-token throughput.
    The shortcut policies produce fewer logical tokens, so their logical ratio is not a
    time ratio; the makespan ratio is."""
    base = next((r for r in rows if r["policy"] == "nonspec"), None)
    for r in rows:
        if base is None:
            r["ratio_to_nonspec"] = r["makespan_ratio"] = r["logical_ratio"] = None
            continue
        r["ratio_to_nonspec"] = r["output_tok_s"] / base["output_tok_s"]
        r["makespan_ratio"] = base["makespan_s"] / r["makespan_s"]
        r["logical_ratio"] = r["throughput_tok_s"] / base["throughput_tok_s"]


def print_row(r: dict, header: bool) -> None:
    if header:
        print(f"{'policy':<8} {'out tok/s':>9} {'x nonspec':>9} {'x makespan':>10} {'x logical':>9} {'logical/s':>9} "
              f"{'ms/out tok':>10} {'gen s':>7} {'verify s':>8} {'other s':>7} {'PRM calls':>9} {'PRM tok/log':>11} "
              f"{'replays':>8} {'wall s':>7}")

    def ratio(k):
        return f"{r[k]:>9.2f}" if r.get(k) is not None else f"{'-':>9}"

    print(f"{r['policy']:<8} {r['output_tok_s']:>9.1f} {ratio('ratio_to_nonspec')} {ratio('makespan_ratio'):>10} "
          f"{ratio('logical_ratio')} {r['throughput_tok_s']:>9.0f} {(r['norm_latency_ms_per_output_tok'] or 0):>10.2f} "
          f"{r['time_generation_s']:>7.2f} {r['time_verification_s']:>8.2f} {r['time_other_s']:>7.2f} "
          f"{r['prm_invocations']:>9} {r['prm_tokens_per_logical_token']:>11.2f} {r['graph_replays']:>8} "
          f"{r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
