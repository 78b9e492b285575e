"""Host work of the torch engine at serving scale, against the stored baseline.

    python -m runners.bench_host_overhead [--rows 256] [--context 2048] [--prm-tasks 256]
        [--prm-tokens 2048] [--repeat 20] [--json OUT] [--save-baseline] [--no-baseline]

Nothing here runs a model: it times what the host does around the forwards, which on a
GPU must fit under the device's step time.

1. Decode iteration, ``--rows`` rows at ``--context`` tokens (block size 16): building the
   ``AttentionBatch`` (token ids, positions, slot mapping, context lengths, block tables,
   to tensors) and the attention plan (engine.attention=auto's on the CPU); then one ``GenerationEngine.step`` with the
   forward stubbed (a fixed logits tensor, vocab 512): scheduling, KV bookkeeping, the
   paired sampler, the per-member draw loop and step ends; the same step with the
   sampler's tensor math (``sampler.draw``: softmax, CDF, search over [rows, vocab] in
   float64, device work on a GPU, host work only here) replaced by its result; and that
   tensor math alone. "decode host total (GPU sampler)" is the host's share of an
   iteration when the device runs the sampler math (kernel launch costs not included:
   unmeasurable without a GPU); "all on the CPU" adds the math back.
2. PRM batch, ``--prm-tasks`` tasks whose paths hold ~``--prm-tokens`` tokens (16 steps;
   the ancestors' pieces exist from earlier batches, each task's own last step is new),
   whole paths (no PRM prefix cache, the largest input). "new pieces": the per-new-token
   work, done once per step when the PRM cache plans the batch (the fresh steps' ids
   converted and checked against the vocabulary, their digests chained); "batch
   preparation": building the rows (``PRMPaths``), their checks and the packed
   ``AttentionBatch`` inputs of every forward, up to the model call.

"current" is the working tree, measured now; "baseline" is read from
``results/bench/bench_host_overhead.json`` (``runners/bench_baseline.py``: its commit and
machine are printed above the table, with a warning when the machine or the sizes differ);
the speed-up is baseline CPU time over current CPU time. ``--save-baseline`` stores this
run's figures as the new baseline; ``--no-baseline`` skips the comparison. Best of
``--repeat``, wall and process-CPU time (the machine may be shared: CPU time is the steadier
figure).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from runners.bench_baseline import Comparison, Machine, add_arguments, compare_with_stored, new_baseline, save_baseline
from specscale.engine.backend import GenBatch, GenRow, ScoreItem
from specscale.engine.block_manager import BlockManager
from specscale.engine.sampler import SamplingParams
from specscale.search.candidate import Candidate, Status

NAME = "bench_host_overhead"
BLOCK = 16
VOCAB = 512
# The table's totals: (label, the rows summed)
TOTALS = (("decode iteration, all on the CPU", ("decode batch + plan", "engine step (forward stubbed)")),
          ("decode host total (GPU sampler)", ("decode batch + plan", "  the same, sampler math stubbed")),
          ("PRM batch host total", ("PRM new pieces (fresh steps)", "PRM batch preparation")))


# ---------------------------------------------------------------- timing
def best_of(fn: Callable[[], Any], repeat: int, setup: Callable[[], Any] | None = None) -> tuple[float, float]:
    """Best wall and best process-CPU seconds of ``fn(setup())`` over ``repeat`` runs."""
    wall, cpu = [], []
    for _ in range(repeat):
        arg = setup() if setup is not None else None
        w0, c0 = time.perf_counter(), time.process_time()
        fn(arg)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(wall), min(cpu)


# ---------------------------------------------------------------- decode scenario
def decode_sequences(rows: int, context: int, seed: int = 0):
    """``rows`` sequences of ``context`` tokens, all but the last cached, on scrambled blocks."""
    from specscale.engine.sequence import PhysicalSequence, history_hash

    rng = np.random.default_rng(seed)
    per_row = -(-context // BLOCK)
    pool = rng.permutation(rows * per_row + 1)
    seqs = []
    for i in range(rows):
        tokens = rng.integers(0, VOCAB, context).tolist()
        seq = PhysicalSequence(sid=i, request_id=i, admit_order=i, tokens=tokens, hist_hash=history_hash(tokens[:8]),
                               num_cached=context - 1, blocks=pool[i * per_row:(i + 1) * per_row].tolist())
        seqs.append(seq)
    return seqs, int(pool.size)


def current_decode_batch(builder, gen: GenBatch, attention):
    batch = builder.gen_batch(gen)
    return batch, attention.plan(batch)


class StubBackend:
    """A forward that costs nothing: the same logits every iteration (no stop tokens)."""

    eos_ids = frozenset()
    delimiter_ids = frozenset()
    max_model_len = None

    def __init__(self, rows: int):
        self.logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1), dtype=torch.float32)

    def forward(self, batch: GenBatch):
        n = sum(r.wants_logits for r in batch.rows)
        return self.logits[:n], 0.0


def decode_engine(rows: int, context: int):
    """A GenerationEngine with ``rows`` running decode sequences at ``context`` tokens, one
    member each, far from any step end."""
    from specscale.engine.generation import GenerationEngine
    from specscale.engine.scheduler import EngineLimits

    blocks = BlockManager(rows * (-(-(context + 4096) // BLOCK)) + 1, BLOCK)  # prefix caching on, as served
    limits = EngineLimits(max_num_seqs=rows, max_num_batched_tokens=max(8192, rows), block_size=BLOCK)
    gen = GenerationEngine(StubBackend(rows), blocks, SamplingParams(0.8, 1.0), limits, 10**6, 10**9, dedup=False)
    rng = np.random.default_rng(2)
    for i in range(rows):
        seq = gen.add_prompt(i, i, rng.integers(0, VOCAB, context).tolist())
        seq.prefix_only = False
        blocks.append(seq.blocks, 0, context - 1)
        seq.num_cached = context - 1
        c = Candidate(cid=i, key=12345 + 7 * i, request_id=i, round=0, child_index=0, parent=None,
                      path_tokens_before=0, status=Status.RUNNING, phys=seq, position=i)
        seq.members.append(c)
    return gen


# ---------------------------------------------------------------- PRM scenario
@dataclass(eq=False)
class _Node:
    """The candidate fields PRMPaths reads."""

    cid: int
    request_id: int
    round: int
    parent: Any
    step_tokens: list[int] = field(default_factory=list)


def prm_tree(tasks: int, tokens: int, steps: int = 16, seed: int = 3):
    """``tasks`` leaf candidates, each on its own chain of ``steps`` steps (~tokens in all
    with the head), and a fresh-leaf maker (a leaf's piece is new in every batch)."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, VOCAB, 64).tolist()
    step_len = max(1, (tokens - len(head)) // steps - 1)
    parents, cid = [], 0
    for t in range(tasks):
        node = _Node(cid, t, -1, None)
        for r in range(steps - 1):
            cid += 1
            node = _Node(cid, t, r, node, rng.integers(0, VOCAB, step_len).tolist())
        parents.append(node)
    last = [rng.integers(0, VOCAB, step_len).tolist() for _ in range(tasks)]

    def leaves():
        return [_Node(10**7 + i, p.request_id, steps - 1, p, last[i]) for i, p in enumerate(parents)]

    return head, parents, leaves


def prm_paths(head, closing):
    from specscale.engine.text.prm_paths import PRMPaths

    sep = VOCAB - 1
    return PRMPaths(lambda rid: head, lambda c: ((*c.step_tokens, sep), len(c.step_tokens)), closing,
                    vocab_size=VOCAB)


def prm_items(paths, leaves, closing) -> list[ScoreItem]:
    return [ScoreItem(c, n_new=paths.prefix_len(c.parent) + len(c.step_tokens) + 1 + len(closing), n_cached=0)
            for c in leaves]


def current_prm_prepare(paths, items, prm) -> list:
    return prm.prepare_rows(paths.rows(items))


def random_prm(max_len: int):
    from specscale.engine.torch.model_config import load_model_config
    from specscale.engine.torch.prm.model import ProcessRewardModel
    from specscale.testbed.tiny_models import ensure_tiny_models

    cfg = load_model_config(ensure_tiny_models()["qwen2_prm"])
    return ProcessRewardModel(None, config=cfg, load_format="random", max_model_len=max_len, dtype=torch.float32)


# ---------------------------------------------------------------- the scenarios
Timings = dict[str, tuple[float, float]]  # row -> (best wall seconds, best CPU seconds)


def time_decode(args, device, sync) -> Timings:
    """1. the decode batch and plan; 2. the engine step without the forward; 2b. the same
    with the sampler's tensor math (softmax, CDF, search: ``sampler.draw``, device work on
    a GPU) replaced by its result, so the step's host work is timed alone, not as a
    difference of two noisy figures; 2c. that tensor math alone, as the step runs it."""
    from specscale.engine import sampler
    from specscale.engine.torch.attention.select import make_attention_backend
    from specscale.engine.torch.attention.batch import BatchBuilder

    out: Timings = {}
    seqs, num_blocks = decode_sequences(args.rows, args.context)
    gen = GenBatch([GenRow(s, s.num_cached, 1, True) for s in seqs])
    builder = BatchBuilder(BLOCK, device, max_positions=args.context + 1, vocab_size=VOCAB, num_blocks=num_blocks,
                           debug_checks=False)
    # As served: engine.attention=auto (on the CPU and on CUDA without a model config: the
    # torch backend, keys gathered through the plan)
    attention = make_attention_backend("auto" if device.type == "cpu" else "torch", device)
    out["decode batch + plan"] = best_of(lambda _: (current_decode_batch(builder, gen, attention), sync()),
                                         args.repeat)

    params = SamplingParams(0.8, 1.0)
    fixed = np.full(args.rows, 5, dtype=np.int64)
    real_draw = sampler.draw
    eng = decode_engine(args.rows, args.context)
    eng.step()  # first call: allocations
    out["engine step (forward stubbed)"] = best_of(lambda _: eng.step(), args.repeat)
    sampler.draw = lambda logits, rows, u, p: fixed[: logits.shape[0]]
    try:
        out["  the same, sampler math stubbed"] = best_of(lambda _: eng.step(), args.repeat)
    finally:
        sampler.draw = real_draw

    logits = StubBackend(args.rows).logits
    keys = np.arange(12345, 12345 + args.rows, dtype=np.uint64)
    u = sampler.paired_uniforms(keys, np.full(args.rows, 7, dtype=np.uint64))
    out["  of which sampler tensor math"] = best_of(lambda _: sampler.draw(logits, None, u, params), args.repeat)
    return out


def time_prm(args) -> Timings:
    """3. PRM batch preparation: the per-new-token pieces, then the rows and their inputs."""
    head, _, leaves = prm_tree(args.prm_tasks, args.prm_tokens)
    closing = (VOCAB - 2, VOCAB - 3)
    prm = random_prm(args.prm_tokens + 512)
    prm.debug_checks = False  # as served
    paths = prm_paths(head, closing)
    for p in leaves():  # the ancestors' pieces were built by earlier batches
        paths.prefix_len(p.parent)

    out: Timings = {}
    # Each step's piece (ids checked, digest chained) is made once, when the PRM cache plans
    # the batch (``prm_path_tokens``): per new token, timed on its own.
    out["PRM new pieces (fresh steps)"] = best_of(lambda lv: [paths.prefix_len(c) for c in lv], args.repeat, leaves)

    def setup():
        lv = leaves()
        for c in lv:
            paths.prefix_len(c)
        return prm_items(paths, lv, closing)

    out["PRM batch preparation"] = best_of(lambda items: current_prm_prepare(paths, items, prm), args.repeat, setup)
    return out


# ---------------------------------------------------------------- main
def settings_of(args) -> dict:
    """What shapes the figures: a baseline with other settings is not like with like."""
    return {k: getattr(args, k) for k in ("rows", "context", "prm_tasks", "prm_tokens", "repeat", "device")}


def figures_of(results: Timings) -> dict:
    return {row: {"wall": {"value": 1e3 * w, "unit": "ms"}, "cpu": {"value": 1e3 * c, "unit": "ms"}}
            for row, (w, c) in results.items()}


def main(argv=None) -> Timings:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prm-tasks", type=int, default=256)
    ap.add_argument("--prm-tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", default="cpu", help="where the batch tensors go (cuda: pinned staging, "
                    "non-blocking copies; the timings then include queuing them, synchronised once per call)")
    ap.add_argument("--json", default=None)
    add_arguments(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    results = {**time_decode(args, device, sync), **time_prm(args)}

    machine = Machine.here() if args.save_baseline or not args.no_baseline else None
    print_table(args, results, compare_with_stored(NAME, args, settings_of(args), machine))
    if args.json:
        Path(args.json).write_text(json.dumps(figures_of(results), indent=2))
    if args.save_baseline:
        path = save_baseline(new_baseline(NAME, argv, settings_of(args), figures_of(results), machine),
                             args.baseline_dir)
        print(f"baseline stored: {path}")
    return results


def print_table(args, results: Timings, comparison: Comparison) -> None:
    """Baseline and current side by side, wall and CPU, per row and per total; a cell the
    baseline lacks (none stored, or a row it did not have) is a dash."""
    print(f"host work, best of {args.repeat} (torch threads 1, device {args.device}); decode: {args.rows} rows x "
          f"{args.context} context; PRM: {args.prm_tasks} tasks x ~{args.prm_tokens} tokens, whole paths")
    for line in comparison.header:
        print(line)
    print(f"{'':<32}{'baseline wall':>14}{'current wall':>14}{'baseline cpu':>14}{'current cpu':>13}{'speed-up':>10}")
    lines = [(row, (row,)) for row in results] + list(TOTALS)
    for label, rows in lines:
        cw, cc = (1e3 * sum(results[r][j] for r in rows) for j in (0, 1))
        bw, bc = (_baseline_sum(comparison, rows, q) for q in ("wall", "cpu"))
        print(f"{label:<32}{_ms(bw, 14)}{_ms(cw, 14)}{_ms(bc, 14)}{_ms(cc, 13)}"
              + (f"{bc / max(cc, 1e-9):>9.1f}x" if bc is not None else f"{'-':>10}"))


def _baseline_sum(comparison: Comparison, rows, quantity: str) -> float | None:
    values = [comparison.value(r, quantity) for r in rows]
    return None if any(v is None for v in values) else sum(values)


def _ms(value: float | None, width: int) -> str:
    return f"{value:>{width - 2}.3f}ms" if value is not None else f"{'-':>{width}}"


if __name__ == "__main__":
    main()
