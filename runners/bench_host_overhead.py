"""Host work of the torch engine at serving scale, the previous implementation side by side.

    python -m runners.bench_host_overhead [--rows 256] [--context 2048] [--prm-tasks 256]
        [--prm-tokens 2048] [--repeat 20] [--baseline 4dcbef5] [--json OUT]

Nothing here runs a model: it times what the host does around the forwards, which on a
GPU must fit under the device's step time (issue 15).

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

"previous" is the code at ``--baseline`` (git show into temporary modules, so both run in
this process on the same data); "current" is the working tree. Best of ``--repeat``,
wall and process-CPU time (the machine may be shared: CPU time is the steadier figure).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

from specscale.engine.backend import GenBatch, GenRow, ScoreItem
from specscale.engine.block_manager import BlockManager
from specscale.engine.sampler import SamplingParams
from specscale.search.candidate import Candidate, Status

BLOCK = 16
VOCAB = 512
REPO = Path(__file__).resolve().parent.parent
BASELINE = "4dcbef5"  # the last commit before issue 15's host-path work


# ---------------------------------------------------------------- the previous code
def legacy_module(rev: str, relpath: str, name: str):
    """Module ``relpath`` as it was at git revision ``rev`` (its own imports resolve to the
    current package, whose interfaces it shares)."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{relpath}"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="legacy-")) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Legacy:
    attention_batch: Any
    attention: Any
    generation: Any
    prm: Any
    prm_paths: Any
    sampler: Any

    @classmethod
    def load(cls, rev: str) -> "Legacy":
        base = "specscale/engine/"
        return cls(
            attention_batch=legacy_module(rev, base + "torch/attention_batch.py", "_legacy_attention_batch"),
            attention=legacy_module(rev, base + "torch/attention.py", "_legacy_attention"),
            generation=legacy_module(rev, base + "generation.py", "_legacy_generation"),
            prm=legacy_module(rev, base + "torch/prm.py", "_legacy_prm"),
            prm_paths=legacy_module(rev, base + "torch/prm_paths.py", "_legacy_prm_paths"),
            sampler=legacy_module(rev, base + "sampler.py", "_legacy_sampler"),
        )


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


def legacy_decode_batch(legacy: Legacy, gen: GenBatch, num_blocks: int, max_positions: int, device):
    """ModelRunner.make_batch + TorchAttentionBackend.plan as they were."""
    ab = legacy.attention_batch
    batch = ab.AttentionBatch.from_rows(
        [ab.BatchRow(r.seq.tokens[r.start: r.start + r.n_new], r.start, r.seq.blocks) for r in gen.rows],
        block_size=BLOCK, device=device, max_positions=max_positions, vocab_size=VOCAB, num_blocks=num_blocks,
    )
    return batch, legacy.attention.TorchAttentionBackend().plan(batch)


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


def decode_engine(module, rows: int, context: int):
    """A GenerationEngine (``module``: previous or current) with ``rows`` running decode
    sequences at ``context`` tokens, one member each, far from any step end."""
    blocks = BlockManager(rows * (-(-(context + 4096) // BLOCK)) + 1, BLOCK)  # prefix caching on, as served
    limits = module.EngineLimits(max_num_seqs=rows, max_num_batched_tokens=max(8192, rows), block_size=BLOCK)
    gen = module.GenerationEngine(StubBackend(rows), blocks, SamplingParams(0.8, 1.0), limits, 10**6, 10**9,
                                  dedup=False)
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


def prm_paths(module, head, closing):
    sep = VOCAB - 1
    return module.PRMPaths(lambda rid: head, lambda c: ((*c.step_tokens, sep), len(c.step_tokens)), closing,
                           **({"vocab_size": VOCAB} if "vocab_size" in module.PRMPaths.__init__.__code__.co_varnames else {}))


def prm_items(paths, leaves, closing) -> list[ScoreItem]:
    return [ScoreItem(c, n_new=paths.prefix_len(c.parent) + len(c.step_tokens) + 1 + len(closing), n_cached=0)
            for c in leaves]


def legacy_prm_prepare(legacy: Legacy, paths, items, prm_like) -> list:
    """TorchBackend.score's row building + ProcessRewardModel.score_rows up to the model
    call, as they were (checks, packing, each chunk's AttentionBatch and reward gather)."""
    rows, _ = paths.rows(items)
    cls = legacy.prm.ProcessRewardModel
    for i, row in enumerate(rows):
        cls._check_row(prm_like, i, row)
    out = []
    ab = legacy.attention_batch
    for chunk in cls._pack(prm_like, rows):
        part = [rows[i] for i in chunk]
        batch = ab.AttentionBatch.from_rows([ab.BatchRow(r.token_ids, r.start, r.block_table) for r in part],
                                            block_size=16, device="cpu")
        gather, offset = [], 0
        for r in part:
            gather.extend(offset + p for p in r.reward_positions)
            offset += len(r.token_ids)
        out.append((batch, torch.tensor(gather, dtype=torch.long)))
    return out


def current_prm_prepare(paths, items, prm) -> list:
    return prm.prepare_rows(paths.rows(items))


def random_prm(max_len: int):
    from specscale.engine.torch.config import load_model_config
    from specscale.engine.torch.prm import ProcessRewardModel
    from specscale.engine.torch.tiny_models import ensure_tiny_models

    cfg = load_model_config(ensure_tiny_models()["qwen2_prm"])
    return ProcessRewardModel(None, config=cfg, load_format="random", max_model_len=max_len, dtype=torch.float32)


# ---------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prm-tasks", type=int, default=256)
    ap.add_argument("--prm-tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the previous implementation")
    ap.add_argument("--device", default="cpu", help="where the batch tensors go (cuda: pinned staging, "
                    "non-blocking copies; the timings then include queuing them, synchronised once per call)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    try:
        legacy = Legacy.load(args.baseline)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:  # no git history here (a device copy)
        print(f"previous implementation ({args.baseline}) not available: {exc}; current only")
        legacy = None
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    results: dict[str, dict[str, tuple[float, float]]] = {}

    # 1. decode batch + plan
    seqs, num_blocks = decode_sequences(args.rows, args.context)
    gen = GenBatch([GenRow(s, s.num_cached, 1, True) for s in seqs])
    max_pos = args.context + 1
    from specscale.engine.torch.batch_builder import BatchBuilder

    builder = BatchBuilder(BLOCK, device, max_positions=max_pos, vocab_size=VOCAB, num_blocks=num_blocks,
                           debug_checks=False)
    from specscale.engine.torch.attention import make_attention_backend

    # As served: engine.attention=auto (on the CPU: decode keys read in place, nothing gathered
    # to plan; on CUDA without a model config: the torch backend)
    attention = make_attention_backend("auto" if device.type == "cpu" else "torch", device)
    results["decode batch + plan"] = {
        "current": best_of(lambda _: (current_decode_batch(builder, gen, attention), sync()), args.repeat),
    }
    if legacy is not None:
        results["decode batch + plan"]["previous"] = best_of(
            lambda _: (legacy_decode_batch(legacy, gen, num_blocks, max_pos, device), sync()), args.repeat)

    # 2. engine step without the forward; 2b. the same with the sampler's tensor math (softmax,
    # CDF, search: ``sampler.draw``, device work on a GPU) replaced by its result, so the step's
    # host work is timed alone, not as a difference of two noisy figures.
    from specscale.engine import generation, sampler

    params = SamplingParams(0.8, 1.0)
    fixed = np.full(args.rows, 5, dtype=np.int64)
    real_draw = sampler.draw
    results["engine step (forward stubbed)"] = {}
    results["  the same, sampler math stubbed"] = {}
    for name, module in (("previous", legacy and legacy.generation), ("current", generation)):
        if module is None:
            continue
        eng = decode_engine(module, args.rows, args.context)
        eng.step()  # first call: allocations
        results["engine step (forward stubbed)"][name] = best_of(lambda _: eng.step(), args.repeat)
        # (the previous engine calls the current sample_rows too: its module imports this package)
        sampler.draw = lambda logits, rows, u, p: fixed[: logits.shape[0]]
        try:
            results["  the same, sampler math stubbed"][name] = best_of(lambda _: eng.step(), args.repeat)
        finally:
            sampler.draw = real_draw

    # 2c. the sampler's tensor math alone, as the step runs it
    logits = StubBackend(args.rows).logits
    member_rows = np.arange(args.rows, dtype=np.int64)
    keys = np.arange(12345, 12345 + args.rows, dtype=np.uint64)
    idx = np.full(args.rows, 7, dtype=np.uint64)
    u = sampler.paired_uniforms(keys, idx)
    results["  of which sampler tensor math"] = {
        "current": best_of(lambda _: sampler.draw(logits, None, u, params), args.repeat),
    }
    if legacy is not None:  # the previous sample_rows, host parts included (no split then)
        results["  of which sampler tensor math"]["previous"] = best_of(
            lambda _: legacy.sampler.sample_rows(logits, member_rows, keys, idx, params), args.repeat)

    # 3. PRM batch preparation
    head, _, leaves = prm_tree(args.prm_tasks, args.prm_tokens)
    closing = (VOCAB - 2, VOCAB - 3)
    prm = random_prm(args.prm_tokens + 512)
    prm.debug_checks = False  # as served
    prm_like = SimpleNamespace(max_model_len=prm.max_model_len, _max_model_len=prm._max_model_len, config=prm.config,
                               kv_cache=None, block_size=None, max_batch_tokens=prm.max_batch_tokens)
    from specscale.engine.torch import prm_paths as current_paths

    results["PRM new pieces (fresh steps)"] = {}
    results["PRM batch preparation"] = {}
    for name, module, prep in (
        ("previous", legacy and legacy.prm_paths, lambda p, it: legacy_prm_prepare(legacy, p, it, prm_like)),
        ("current", current_paths, lambda p, it: current_prm_prepare(p, it, prm)),
    ):
        if module is None:
            continue
        paths = prm_paths(module, head, closing)
        for p in leaves():  # the ancestors' pieces were built by earlier batches
            paths.prefix_len(p.parent)

        # Each step's piece (ids checked, digest chained) is made once, when the PRM cache
        # plans the batch (``prm_path_tokens``): per new token, timed on its own.
        results["PRM new pieces (fresh steps)"][name] = best_of(
            lambda lv, p=paths: [p.prefix_len(c) for c in lv], args.repeat, leaves)

        def setup(paths=paths):
            lv = leaves()
            for c in lv:
                paths.prefix_len(c)
            return prm_items(paths, lv, closing)

        results["PRM batch preparation"][name] = best_of(lambda items, p=paths, f=prep: f(p, items), args.repeat,
                                                         setup)

    print_table(args, results)
    if args.json:
        Path(args.json).write_text(json.dumps({k: {n: {"wall_ms": 1e3 * w, "cpu_ms": 1e3 * c}
                                                   for n, (w, c) in v.items()} for k, v in results.items()}, indent=2))
    return results


def print_table(args, results) -> None:
    print(f"host work, best of {args.repeat} (torch threads 1, device {args.device}); decode: {args.rows} rows x "
          f"{args.context} context; PRM: {args.prm_tasks} tasks x ~{args.prm_tokens} tokens, whole paths")
    print(f"{'':<32}{'previous wall':>14}{'current wall':>14}{'previous cpu':>14}{'current cpu':>13}{'speed-up':>10}")
    nan = (float("nan"), float("nan"))
    for what, by in results.items():
        (pw, pc), (cw, cc) = by.get("previous", nan), by["current"]
        print(f"{what:<32}{1e3 * pw:>12.3f}ms{1e3 * cw:>12.3f}ms{1e3 * pc:>12.3f}ms{1e3 * cc:>11.3f}ms"
              f"{pc / max(cc, 1e-9):>9.1f}x")
    for label, keys in (("decode iteration, all on the CPU", ("decode batch + plan", "engine step (forward stubbed)")),
                        ("decode host total (GPU sampler)", ("decode batch + plan", "  the same, sampler math stubbed")),
                        ("PRM batch host total", ("PRM new pieces (fresh steps)", "PRM batch preparation"))):
        (pw, pc), (cw, cc) = ([sum(results[k].get(n, nan)[j] for k in keys) for j in (0, 1)]
                              for n in ("previous", "current"))
        print(f"{label:<32}{1e3 * pw:>12.3f}ms{1e3 * cw:>12.3f}ms{1e3 * pc:>12.3f}ms"
              f"{1e3 * cc:>11.3f}ms{pc / max(cc, 1e-9):>9.1f}x")


if __name__ == "__main__":
    main()
