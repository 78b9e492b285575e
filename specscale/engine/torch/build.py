"""Build the torch backend and its problems from a cell spec (``engine=torch``).

``build_torch`` takes the spec; the helpers below it read the engine- and model-specific
settings from the spec's resolved config (``spec.resolved()``), which tests and
benchmarks that load models once (``build_models``) also pass.

Checkpoints are named by ``model.generator.hf_name`` / ``model.prm.hf_name``:

* ``tiny/<name>``        the self-built tiny set (``ensure_tiny_models()``: qwen2, llama,
                         qwen2_prm, llama_prm), written to the local cache on first use;
* ``testbed/<name>``     the trained CPU testbed shipped with the package (generator, prm;
                         ``specscale/testbed/weights/``, written by ``runners.train_testbed``);
* a local directory      used as is (``config.json`` + safetensors + tokenizer files);
* a hub name (org/name)  resolved in the local Hugging Face cache only: nothing is
                         downloaded, an absent model is a clear error naming it.

KV pools (memory_plan.py): the generator's (``engine.kv_blocks``) and, with
``engine.prm_prefix_cache=true``, the PRM's (``engine.prm_kv_blocks``). A number is used
as is (the scheduler's block managers are sized from the same config keys, so both
agree); null means: on CUDA, after both models are loaded and a profile run has measured
the activation peak of the largest PRM batch and generator prefill, ``total *
gpu_memory_utilization - memory in use - that peak``, split with the PRM pool by the
pair's ``memory.prm_kv_fraction`` when the cache is on (vLLM-style accounting); on CPU
``engine.cpu_kv_blocks`` / ``engine.cpu_prm_kv_blocks``. The plan is kept as
``runner.memory_plan``.

Warm-up (docs/design.md §6): before serving, ``warm_up`` installs the op set of
``engine.fused_ops`` on both models (compiling it when on: ``fused_ops.py``), captures the
decode graphs of every bucket the cell can use (its longest context: min(window, longest
prompt + search.path_token_cap)) and runs one dummy iteration of each model at its largest
batch; its seconds accumulate in ``runner.warmup_seconds``. Nothing is subtracted from
measured time afterwards.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from pathlib import Path
from typing import Any, Mapping

import torch

from specscale.settings.search_policy import ConfigError
from specscale.engine.checkpoints import resolve_checkpoint
from specscale.engine.torch.backend import TorchBackend
from specscale.engine.torch.model_config import ModelConfig, parse_dtype
from specscale.engine.torch.model.fused_ops import FusedOps
from specscale.engine.torch.runtime.memory_plan import MemoryPlan, allocate_pools, dummy_prm_inputs, plan_memory
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.tokenizer import load_tokenizer
from specscale.settings import CellSpec

logger = logging.getLogger(__name__)

# Model-config PRM format names -> ProcessRewardModel's names.
PRM_FORMATS = {"qwen_math_prm": "qwen_math_prm", "rlhflow_llama_prm": "rlhflow", "rlhflow": "rlhflow"}


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"engine.device={name} but CUDA is not available on this machine")
    return dev


def _with_context(role: str, path: Path, exc: Exception) -> Exception:
    """The same exception type (when it takes a message), naming the config key and the checkpoint."""
    msg = f"model.{role} ({path}): {exc}"
    try:
        return type(exc)(msg)
    except TypeError:
        return (FileNotFoundError if isinstance(exc, FileNotFoundError) else ValueError)(msg)


def plan_kv_memory(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel | None = None) -> MemoryPlan:
    """The KV pools' sizes for this config (memory_plan.py; on CUDA: a profile run)."""
    return plan_memory(cfg, runner, prm, scratch_block=uses_decode_graphs(cfg, runner.device))


def _kv_blocks(cfg: Mapping[str, Any], runner: ModelRunner, device: torch.device,
               prm: ProcessRewardModel | None = None) -> int:
    """The generator pool of this config's memory plan, in blocks."""
    return plan_kv_memory(cfg, runner, prm).gen_blocks


def uses_decode_graphs(cfg: Mapping[str, Any], device: torch.device) -> bool:
    return device.type == "cuda" and bool(cfg["engine"].get("cuda_graphs", True))


def allocate_kv(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel) -> MemoryPlan:
    """Both KV pools, sized after both models' weights are in memory (and the attention
    backend is set: the profile runs the serving kernels); with decode graphs the
    generator's pool gets their hidden scratch block (allocated once, not resized later)."""
    plan = plan_kv_memory(cfg, runner, prm)
    allocate_pools(plan, runner, prm, scratch_block=uses_decode_graphs(cfg, runner.device))
    return plan


def build_models(cfg: Mapping[str, Any]) -> tuple[ModelRunner, ProcessRewardModel]:
    runner, prm = _load_models(cfg)
    _set_attention(cfg, runner, prm)
    allocate_kv(cfg, runner, prm)
    eng = cfg["engine"]
    if uses_decode_graphs(cfg, runner.device):
        runner.enable_decode_graphs(max_batch=min(256, int(eng.get("max_num_seqs") or 256)))
    return runner, prm


def run_max_context(cfg: Mapping[str, Any], prompt_lengths, max_model_len: int) -> int:
    """The longest context a cell's generator can reach: min(window, longest prompt +
    search.path_token_cap) (a path stops at the cap, or at the window)."""
    longest = max(prompt_lengths, default=0)
    return min(int(max_model_len), longest + int(cfg["search"]["path_token_cap"]))


_PRM_WARM: "weakref.WeakSet[ProcessRewardModel]" = weakref.WeakSet()


def warm_up(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel, max_context: int) -> float:
    """Everything that must not be charged to a policy, before serving starts: the op set of
    engine.fused_ops on both models (compiled now when on), decode graphs for every bucket
    up to ``max_context`` tokens and, on CUDA (the caching allocator, lazy kernel setup),
    one generator iteration of engine.max_num_batched_tokens tokens (logits of
    engine.max_num_seqs rows) and one PRM batch of engine.prm_max_batch_tokens tokens.
    On the CPU those two are skipped (nothing to warm, and seconds of work for a tiny
    model in float64). Once per model pair (a reused pair only captures buckets a longer
    context needs). Seconds, also added to ``runner.warmup_seconds``."""
    eng = cfg["engine"]
    cuda = runner.device.type == "cuda"
    for model in (runner, prm):  # the cell's setting (a reused pair may have served another)
        model.fused_ops.enabled = bool(eng.get("fused_ops", False))
    seconds = runner.warm_up(
        max_context, prefill_tokens=int(eng.get("max_num_batched_tokens") or 0) if cuda else None,
        logit_rows=int(eng.get("max_num_seqs") or 0) or None,
    )
    prm_ops_s = prm.warm_up()
    runner.warmup_seconds += prm_ops_s
    seconds += prm_ops_s
    if cuda and prm not in _PRM_WARM:
        t0 = time.perf_counter()
        tokens = int(eng.get("prm_max_batch_tokens") or 0)
        if tokens > 0:
            prm.score_token_ids(dummy_prm_inputs(prm, tokens))
        runner.synchronize()
        _PRM_WARM.add(prm)
        prm_s = time.perf_counter() - t0
        runner.warmup_seconds += prm_s
        seconds += prm_s
    graphs = runner.graphs
    fused = runner.fused_ops
    logger.info("warm-up before serving: %.2f s (contexts up to %d tokens%s%s)", seconds, max_context,
                f", {graphs.num_captured} decode graphs" if graphs is not None else "",
                ", fused ops compiled" if fused.active else "")
    return seconds


def ensure_prm_pool(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel) -> None:
    """A reused model pair may serve a cell whose engine.prm_prefix_cache differs from the
    config it was built with. Cache off: an existing PRM pool just stays unused. Cache on
    without a pool: one is allocated from engine.prm_kv_blocks (or, on CPU,
    engine.cpu_prm_kv_blocks); on CUDA without prm_kv_blocks this is an error (sizing it
    from memory needs a fresh build)."""
    if not cfg["engine"].get("prm_prefix_cache", True) or getattr(prm, "kv_cache", None) is not None:
        return
    if runner.device.type == "cuda" and cfg["engine"].get("prm_kv_blocks") is None:
        raise ConfigError(
            "engine.prm_prefix_cache=true, but these models were built without a PRM KV pool "
            "(engine.prm_prefix_cache=false): build them with the cell's config, or set engine.prm_kv_blocks"
        )
    fixed = {**cfg, "engine": {**cfg["engine"], "kv_blocks": runner.num_blocks}}
    plan = plan_memory(fixed, runner, prm)  # both pools fixed: nothing is probed
    prm.allocate_kv_cache(plan.prm_blocks, plan.block_size)
    if runner.memory_plan is not None:
        runner.memory_plan = dataclasses.replace(runner.memory_plan, prm_blocks=plan.prm_blocks,
                                                 prm_prefix_cache=True)


def _set_attention(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel) -> None:
    """engine.attention: auto = FlashInfer on CUDA (bf16/fp16) when importable, else torch;
    cpu_kernel = torch with the CPU paged decode kernel (an error where it cannot be built)."""
    from specscale.engine.torch.attention.select import make_attention_backend

    name = str(cfg["engine"].get("attention") or "auto")
    try:
        runner.backend = make_attention_backend(name, runner.device, runner.config, runner.dtype)
        prm.backend = make_attention_backend(name, prm.device, prm.config, runner.dtype)
    except ConfigError:  # already names the setting and the fix
        raise
    except ValueError as exc:
        raise ConfigError(f"engine.attention={name}: {exc}") from exc
    if runner.backend.name == "flashinfer":
        # Build/load FlashInfer's kernels now: a first-use nvcc build inside the first
        # measured iteration would be charged to the policy as serving time.
        try:
            for model in (runner, prm):
                seconds = model.backend.warm_up()
                runner.warmup_seconds += sum(seconds.values())  # kernel JIT/load: warm-up, reported
                logger.info("flashinfer kernels ready for %s: %s", model.config.architecture,
                            {k: round(v, 2) for k, v in seconds.items()})
        except Exception as exc:  # no nvcc, a failed build, a broken install
            if name == "flashinfer":
                raise ConfigError(f"engine.attention=flashinfer: its kernels do not run here: {exc}") from exc
            logger.warning("flashinfer kernels unavailable (%s: %s); using the torch attention backend",
                           type(exc).__name__, exc)
            runner.backend = make_attention_backend("torch", runner.device)
            prm.backend = make_attention_backend("torch", prm.device)
    path = runner.backend.provenance()["path"]
    if path != "torch":
        logger.info("attention backend: %s", path)


def _load_models(cfg: Mapping[str, Any]) -> tuple[ModelRunner, ProcessRewardModel]:
    eng, model = cfg["engine"], cfg["model"]
    device = resolve_device(eng.get("device"))
    threads = eng.get("cpu_threads")
    if device.type == "cpu" and threads:
        torch.set_num_threads(int(threads))  # process-wide: this process serves one cell
    dtype = parse_dtype(eng.get("dtype") or model.get("dtype"))
    block_size = int(eng["block_size"])
    fmt_name = str(model["prm"].get("format") or "")
    if fmt_name not in PRM_FORMATS:
        raise ConfigError(f"model.prm.format={fmt_name!r}: unknown PRM format; choose one of {sorted(PRM_FORMATS)}")
    prm_max_len = eng.get("prm_max_len") or model.get("prm_max_len")
    load_format = str(model.get("load_format") or "auto")
    fused = FusedOps(bool(eng.get("fused_ops", False)))  # one switch for the pair: they fall back together
    if load_format == "random":
        return _build_random(cfg, device, dtype, block_size, PRM_FORMATS[fmt_name], prm_max_len, fused)
    if load_format not in ("auto", "checkpoint"):
        raise ConfigError(f"model.load_format={load_format!r}: choose one of auto, checkpoint, random")
    gen_dir = resolve_checkpoint(model["generator"]["hf_name"], "generator")
    prm_dir = resolve_checkpoint(model["prm"]["hf_name"], "prm")
    try:
        # The PRM first, then the generator: the KV pool is sized from what both left free.
        prm = ProcessRewardModel(
            prm_dir, dtype=dtype, device=device, prm_format=PRM_FORMATS[fmt_name],
            max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
            max_model_len=int(prm_max_len) if prm_max_len else None, debug_checks=eng.get("debug_checks"),
            fused_ops=fused,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise _with_context("prm", prm_dir, exc) from exc
    try:
        runner = ModelRunner(gen_dir, num_blocks=1, block_size=block_size, dtype=dtype, device=device,
                             debug_checks=eng.get("debug_checks"), fused_ops=fused)
    except (FileNotFoundError, ValueError) as exc:
        raise _with_context("generator", gen_dir, exc) from exc
    return runner, prm


def _random_config(hf_name: str, role: str) -> ModelConfig:
    from specscale.engine.torch.model.configs import config_for

    try:
        return ModelConfig.from_dict(config_for(str(hf_name)), source=f"model.{role}.hf_name={hf_name}")
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"model.load_format=random, model.{role}: {exc}") from exc


def _build_random(cfg, device, dtype, block_size, prm_format, prm_max_len, fused: FusedOps):
    """Random weights from the stored architecture (no download, no weight files). Such a
    model has no tokenizer: it runs on token ids, i.e. in synthetic-token mode."""
    eng, model = cfg["engine"], cfg["model"]
    if not eng.get("synthetic_tokens"):
        raise ConfigError(
            "model.load_format=random needs engine.synthetic_tokens=true: random weights come without a "
            "tokenizer, so tokens and PRM scores must come from the synthetic workload"
        )
    seed = int(cfg.get("seed", 0) or 0)
    prm = ProcessRewardModel(
        None, config=_random_config(model["prm"]["hf_name"], "prm"), load_format="random", dtype=dtype,
        device=device, prm_format=prm_format, max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
        max_model_len=int(prm_max_len) if prm_max_len else None, seed=seed + 1, debug_checks=eng.get("debug_checks"),
        fused_ops=fused,
    )
    runner = ModelRunner(
        None, config=_random_config(model["generator"]["hf_name"], "generator"), load_format="random",
        num_blocks=1, block_size=block_size, dtype=dtype, device=device, seed=seed,
        debug_checks=eng.get("debug_checks"), fused_ops=fused,
    )
    return runner, prm


def build_synthetic(spec: CellSpec, models=None):
    """engine.synthetic_tokens=true: real models, the sim's synthetic workload and problems."""
    from specscale.engine.synthetic.build import prm_format_tokens, sim_problems, synthetic_workload
    from specscale.engine.torch.synthetic import SyntheticTorchBackend

    cfg = spec.resolved()
    workload, problems = synthetic_workload(spec), sim_problems(spec)
    runner, prm = models if models is not None else build_models(cfg)
    ensure_prm_pool(cfg, runner, prm)
    try:
        backend = SyntheticTorchBackend(
            runner, prm, workload, dict(enumerate(problems)), *prm_format_tokens(cfg["model"])
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    prompts = [len(backend.prompt_tokens(p)) for p in problems]
    warm_up(cfg, runner, prm, run_max_context(cfg, prompts, backend.max_model_len))
    profile_prm_for_adaptive(spec, backend, runner, prm)
    return backend, problems


def profile_prm_for_adaptive(spec: CellSpec, backend: Any, runner: ModelRunner, prm: ProcessRewardModel) -> None:
    """policy.verification=adaptive: time the PRM's cost curve before serving
    (``prm_profile.py``); the Server seeds the adaptive monitor with it."""
    if spec.policy.verification != "adaptive":
        return
    cfg = spec.resolved()
    from specscale.engine.torch.prm.profile import profile_prm_curve

    t0 = time.perf_counter()
    backend.prm_profile = profile_prm_curve(prm, runner.synchronize, int(cfg["engine"].get("prm_max_batch_tokens")
                                                                          or 8192))
    seconds = time.perf_counter() - t0
    runner.warmup_seconds += seconds
    logger.info("PRM cost profile for adaptive verification: %s (%.2f s, before serving)",
                ", ".join(f"{n} tok {1e3 * t:.1f} ms" for n, t in backend.prm_profile), seconds)


def build_torch(spec: CellSpec, models=None):
    """The torch backend and the dataset problems for this cell, warmed up for it (decode
    graphs up to its longest context, allocator). models: an already loaded
    (ModelRunner, ProcessRewardModel) pair of this cell's models, reused with its KV pools
    (and captured decode graphs) as is: the cell's block managers start empty, and stale
    cache contents are overwritten before they are read."""
    from specscale.data.loader import load_problems

    cfg = spec.resolved()
    if cfg["engine"].get("synthetic_tokens"):
        return build_synthetic(spec, models)

    problems = load_problems(spec.dataset, n_problems=spec.n_problems)  # cheap: fail fast
    runner, prm = models if models is not None else build_models(cfg)
    ensure_prm_pool(cfg, runner, prm)
    try:
        tokenizer = load_tokenizer(runner.model_dir)
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise _with_context("generator", runner.model_dir, exc) from exc
    backend = TorchBackend(runner, prm, tokenizer, dict(enumerate(problems)))
    # Fail before anything runs if a prompt cannot fit the context window.
    prompts = [len(backend.prompt_tokens(p)) for p in problems]
    longest = max(prompts)
    path_cap = spec.search.path_token_cap
    if longest + path_cap > backend.max_model_len:
        logger.warning(
            "generator context window %d < longest prompt %d + search.path_token_cap %d: paths that reach "
            "the window end there with EOS", backend.max_model_len, longest, path_cap,
        )
    # The PRM reads the question and the path's text (re-tokenized, plus format tokens).
    longest_path = min(path_cap, backend.max_model_len - min(prompts))
    if longest_path >= prm.max_model_len:
        logger.warning(
            "PRM window %d tokens < the longest possible path (%d generator tokens): scoring such a path "
            "fails; lower search.path_token_cap or set engine.prm_max_len", prm.max_model_len, longest_path,
        )
    warm_up(cfg, runner, prm, run_max_context(cfg, prompts, backend.max_model_len))
    profile_prm_for_adaptive(spec, backend, runner, prm)
    return backend, problems
