"""Run one cell of the factorial from its spec and write its results.

``run_cell`` and ``build_server`` are entry points (tests and benchmarks call them with a
composed config): a config is validated into a ``CellSpec`` there, once; a spec passes
through. Everything they call (the backend builders, the store's hash, W&B, the
provenance block, the Server) reads the spec.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import OmegaConf

from specscale.settings import CellSpec, cell_spec
from specscale.engine.registry import build_backend
from specscale.engine.scheduler import EngineLimits
from specscale.metrics.summary import summarize
from specscale.metrics.writer import atomic_write, write_json, write_tables
from specscale.results import provenance
from specscale.results.glance import engine_kind
from specscale.results.store import canonical_policy
from specscale.results.tracking import log_cell
from specscale.server.arrivals import arrival_times
from specscale.server.request import Request
from specscale.server.server import Server

SUMMARY_KEYS_SHOWN = (
    "output_tok_s", "logical_tok_s", "norm_latency_ms_per_output_tok", "latency_p99_s", "accuracy", "prm_invocations",
    "physical_logical_ratio", "shortcut_round_fraction", "makespan_s",
)

def build_server(cell: CellSpec | Mapping[str, Any], on_request_done=None, built=None) -> Server:
    """cell: a spec, or a config to validate into one. built: (backend, problems) to serve
    instead of building them (benchmarks that reuse loaded models across cells); they
    must be built for the same cell."""
    spec = cell_spec(cell)
    eng = spec.engine
    backend, problems = built if built is not None else build_backend(spec)
    arrivals = arrival_times(len(problems), spec.workload.kind, spec.workload.rate, spec.seed)
    requests = [Request(i, p, t) for i, (p, t) in enumerate(zip(problems, arrivals))]
    limits = EngineLimits(eng.max_num_seqs, eng.max_num_batched_tokens, eng.block_size)
    return Server(
        backend, spec.search, spec.policy, requests, spec.concurrency, spec.seed, limits,
        kv_blocks=eng.kv_blocks, prm_prefix_cache=eng.prm_prefix_cache,
        prm_kv_blocks=eng.prm_kv_blocks, prefix_caching=eng.prefix_caching,
        on_request_done=on_request_done,
    )


def run_cell(
    cell: CellSpec | Mapping[str, Any],
    out_dir: Optional[Path] = None,
    progress: bool = False,
    extra: Optional[Mapping[str, Any]] = None,
    built=None,
) -> dict:
    """Run the cell (a spec, or a config to validate into one); write its files to
    out_dir (if given); return the summary. built: see ``build_server``."""
    spec = cell_spec(cell)
    bar = None
    if progress:
        from tqdm import tqdm

        # The total is set once the problems are known (a dataset may hold fewer than n_problems).
        bar = tqdm(total=None, desc=f"{spec.policy.name} b{spec.search.beam}", unit="req")
    wall0 = time.perf_counter()
    tokens, served_by = [0], []

    def on_done(req) -> None:
        # Live display: requests done and the summary's throughput so far, output tokens (of
        # the returned paths) per modelled or measured second; the recorder has just logged
        # this request.
        tokens[0] += served_by[0].recorder.requests[-1]["output_tokens"]
        bar.update(1)
        bar.set_postfix(output_tok_s=f"{tokens[0] / max(req.finish_time, 1e-9):.1f}", t=f"{req.finish_time:.1f}s")

    server = build_server(spec, on_request_done=on_done if bar is not None else None, built=built)
    served_by.append(server)
    if bar is not None:
        bar.reset(total=len(server.waiting))
    served = [r.problem for r in sorted(server.waiting, key=lambda r: r.request_id)]
    rec = server.run()
    if bar is not None:
        bar.close()
    bs = server.blocks.block_size
    summary = summarize(rec, list(spec.latency_budgets_s), server.backend.bytes_per_block(bs),
                        server.backend.prm_bytes_per_block(bs))
    summary.update(
        policy=spec.policy.name, model=spec.model.name, dataset=spec.dataset.name,
        engine=spec.engine.name, hardware=spec.hardware, workload=spec.workload.kind,
        search=spec.search.kind, beam=spec.search.beam, expansion=spec.search.expansion,
        concurrency=spec.concurrency, seed=spec.seed,
        wall_s=time.perf_counter() - wall0, leaked_blocks=rec.leaked_blocks,
        # The problems actually served (n_problems=all: the dataset's size).
        rate=spec.workload.rate, n_problems=len(served),
        temperature=spec.search.temperature, max_rounds=spec.search.max_rounds,
        ablation=spec.config.get("ablation") or "none",  # the mechanism switched off (conf/ablation/)
    )
    # Every policy switch the policy uses (None for switches its modes ignore), so
    # analysis can tell apart cells of one policy swept over a switch (Fig. 16's b_max).
    summary.update({f"policy_{k}": v for k, v in canonical_policy(spec.config["policy"]).items() if k != "name"})
    runner = server.backend.runner
    # The device the compute ran on (engine=sim: the host CPU; `hardware` is the modelled GPU).
    summary["provenance"] = provenance.collect(spec, _device_used(spec, server.backend), served,
                                               server.backend.attention_paths())
    if spec.engine.name != "sim":
        # Measured on a real device: name it (the hardware config only shapes the sim's cost model).
        summary["hardware"] = summary["provenance"]["device"]["name"]
    if runner is not None:  # torch: warm-up done before the clock, and the KV memory plan
        summary["warmup_s"] = runner.warmup_seconds
        if runner.memory_plan is not None:
            summary.update({f"memory_{k}": v for k, v in runner.memory_plan.as_dict().items()})
    summary["engine_features"] = engine_features(spec, server.backend)
    summary["measured"] = engine_kind(summary)  # simulated (on what) or measured (on which engine and device)
    summary.update(server.backend.summary_extras())  # vLLM: its own token, cache and request accounting
    summary.update(extra or {})
    if rec.leaked_blocks or rec.leaked_sequences:
        raise RuntimeError(f"KV leak: {rec.leaked_blocks} blocks / {rec.leaked_sequences} sequences left allocated")
    if out_dir is not None:
        out_dir = Path(out_dir)
        resolved = spec.resolved()
        write_json(out_dir / "config.json", resolved)
        _save_yaml(out_dir / "config.yaml", resolved)
        write_tables(out_dir, rec)
        log_cell(spec, summary, rec.iterations, out_dir)
        write_json(out_dir / "summary.json", summary)  # last: its presence marks a complete cell
    return summary


def engine_features(spec: CellSpec, backend) -> dict:
    """What the engine could express of the policy (docs/design.md §6): an engine that cannot run
    part of a policy says so here instead of silently running something else."""
    if backend.engine_features is not None:
        return dict(backend.engine_features)
    return {
        "engine": spec.engine.name, "token_level_cd": True, "prefix_sharing": "content_hashed_blocks",
        "prm_prefix_cache": spec.engine.prm_prefix_cache,
    }


def _device_used(spec: CellSpec, backend) -> Any:
    """The device the cell computed on: the backend's own when it says (torch), else what
    engine.device resolves to; engine=sim computes on the host CPU."""
    device = backend.runner.device if backend.runner is not None else backend.device
    if device is not None or spec.engine.name == "sim":
        return device
    import torch

    name = str(spec.config["engine"].get("device") or "auto")
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def _save_yaml(path: Path, cfg: Mapping[str, Any]) -> None:
    atomic_write(path, lambda tmp: OmegaConf.save(OmegaConf.create(dict(cfg)), tmp))


def format_summary(summary: Mapping[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['policy']} | {summary['model']} | {summary['dataset']} | beam {summary['beam']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in SUMMARY_KEYS_SHOWN:
        v = summary.get(k)
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console = Console(record=True, width=100)
    with console.capture() as cap:
        console.print(summary.get("measured") or f"engine={summary['engine']}")  # simulated or measured, first
        console.print(table)
    return cap.get()
