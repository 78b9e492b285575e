"""Build the torch backend and its problems from a composed config (``engine=torch``).

Checkpoints are named by ``model.generator.hf_name`` / ``model.prm.hf_name``:

* ``tiny/<name>``        the self-built tiny set (``ensure_tiny_models()``: qwen2, llama,
                         qwen2_prm, llama_prm), written to the local cache on first use;
* a local directory      used as is (``config.json`` + safetensors + tokenizer files);
* a hub name (org/name)  resolved in the local Hugging Face cache only: nothing is
                         downloaded, an absent model is a clear error naming it.

KV pool (``engine.kv_blocks``): a number is used as is (the scheduler's BlockManager is
sized from the same config key, so both agree); null means: on CUDA, after both models
are loaded, ``total * gpu_memory_utilization - memory in use`` split with the PRM by the
pair's ``memory.prm_kv_fraction`` (vLLM-style accounting); on CPU ``engine.cpu_kv_blocks``.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from specscale.config import ConfigError
from specscale.engine.torch.backend import TorchBackend
from specscale.engine.torch.config import ModelConfig, parse_dtype
from specscale.engine.torch.kv_cache import PagedKVCache
from specscale.engine.torch.model_runner import ModelRunner
from specscale.engine.torch.prm import ProcessRewardModel
from specscale.engine.torch.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

TINY_PREFIX = "tiny/"
# Model-config PRM format names -> ProcessRewardModel's names.
PRM_FORMATS = {"qwen_math_prm": "qwen_math_prm", "rlhflow_llama_prm": "rlhflow", "rlhflow": "rlhflow"}


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"engine.device={name} but CUDA is not available on this machine")
    return dev


def resolve_checkpoint(hf_name: str, role: str) -> Path:
    """``model.<role>.hf_name`` -> a local checkpoint directory."""
    key = f"model.{role}.hf_name"
    if not hf_name:
        raise ConfigError(f"{key} is empty")
    hf_name = str(hf_name)
    if hf_name.startswith(TINY_PREFIX):
        from specscale.engine.torch.tiny_models import ensure_tiny_models

        paths = ensure_tiny_models()
        name = hf_name[len(TINY_PREFIX):]
        if name not in paths:
            choices = sorted(TINY_PREFIX + n for n in paths)
            raise ConfigError(f"{key}={hf_name!r}: no such tiny model; choose one of {choices}")
        return paths[name]
    path = Path(hf_name).expanduser()
    if path.is_dir():
        return path
    looks_like_path = hf_name.startswith(("/", ".", "~")) or hf_name.count("/") != 1
    if looks_like_path:
        raise FileNotFoundError(f"{key}={hf_name!r}: checkpoint directory not found: {path}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hf_name, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, offline errors, ...
        raise FileNotFoundError(
            f"{key}={hf_name!r}: the model is not in the local Hugging Face cache and this harness never "
            f"downloads; fetch it beforehand (huggingface-cli download {hf_name}) or set {key} to a local "
            f"checkpoint directory ({type(exc).__name__}: {exc})"
        ) from None


def _with_context(role: str, path: Path, exc: Exception) -> Exception:
    """The same exception type (when it takes a message), naming the config key and the checkpoint."""
    msg = f"model.{role} ({path}): {exc}"
    try:
        return type(exc)(msg)
    except TypeError:
        return (FileNotFoundError if isinstance(exc, FileNotFoundError) else ValueError)(msg)


def _kv_blocks(cfg: Mapping[str, Any], runner: ModelRunner, device: torch.device) -> int:
    eng, memory = cfg["engine"], cfg["model"].get("memory") or {}
    if eng.get("kv_blocks") is not None:
        return int(eng["kv_blocks"])
    if device.type != "cuda":
        return int(eng.get("cpu_kv_blocks") or 4096)
    util = float(memory.get("gpu_memory_utilization", 0.9))
    prm_fraction = float(memory.get("prm_kv_fraction", 0.3))
    torch.cuda.synchronize(device)
    # Loading frees memory (fused projections replace the per-projection weights); the
    # caching allocator keeps it reserved, which mem_get_info would count as in use.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    usable = total * util - (total - free)  # what the utilisation share leaves after weights and other users
    per_block = PagedKVCache.bytes_per_block(runner.config, runner.block_size, runner.dtype)
    blocks = int(usable * (1.0 - prm_fraction) // per_block)
    if blocks < 1:
        raise ConfigError(
            f"no GPU memory left for the KV cache: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB, "
            f"utilisation {util}; lower the model size or raise model.memory.gpu_memory_utilization"
        )
    return blocks


def uses_decode_graphs(cfg: Mapping[str, Any], device: torch.device) -> bool:
    return device.type == "cuda" and bool(cfg["engine"].get("cuda_graphs", True))


def allocate_kv(cfg: Mapping[str, Any], runner: ModelRunner) -> None:
    """The generator's KV pool, sized after both models' weights are in memory; with
    decode graphs, plus their hidden scratch block (allocated once, not resized later)."""
    runner.allocate_kv_cache(_kv_blocks(cfg, runner, runner.device),
                             scratch_block=uses_decode_graphs(cfg, runner.device))


def build_models(cfg: Mapping[str, Any]) -> tuple[ModelRunner, ProcessRewardModel]:
    runner, prm = _load_models(cfg)
    _set_attention(cfg, runner, prm)
    eng = cfg["engine"]
    if uses_decode_graphs(cfg, runner.device):
        runner.enable_decode_graphs(max_batch=min(256, int(eng.get("max_num_seqs") or 256)))
    return runner, prm


def _set_attention(cfg: Mapping[str, Any], runner: ModelRunner, prm: ProcessRewardModel) -> None:
    """engine.attention: auto = FlashInfer on CUDA (bf16/fp16) when importable, else torch."""
    from specscale.engine.torch.attention import make_attention_backend

    name = str(cfg["engine"].get("attention") or "auto")
    try:
        runner.backend = make_attention_backend(name, runner.device, runner.config, runner.dtype)
        prm.backend = make_attention_backend(name, prm.device, prm.config, runner.dtype)
    except ValueError as exc:
        raise ConfigError(f"engine.attention={name}: {exc}") from exc
    if runner.backend.name == "flashinfer":
        # Build/load FlashInfer's kernels now: a first-use nvcc build inside the first
        # measured iteration would be charged to the policy as serving time.
        try:
            for model in (runner, prm):
                seconds = model.backend.warm_up()
                logger.info("flashinfer kernels ready for %s: %s", model.config.architecture,
                            {k: round(v, 2) for k, v in seconds.items()})
        except Exception as exc:  # no nvcc, a failed build, a broken install
            if name == "flashinfer":
                raise ConfigError(f"engine.attention=flashinfer: its kernels do not run here: {exc}") from exc
            logger.warning("flashinfer kernels unavailable (%s: %s); using the torch attention backend",
                           type(exc).__name__, exc)
            runner.backend = make_attention_backend("torch", runner.device)
            prm.backend = make_attention_backend("torch", prm.device)
    if runner.backend.name != "torch":
        logger.info("attention backend: %s", runner.backend.name)


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
    if load_format == "random":
        return _build_random(cfg, device, dtype, block_size, PRM_FORMATS[fmt_name], prm_max_len)
    if load_format not in ("auto", "checkpoint"):
        raise ConfigError(f"model.load_format={load_format!r}: choose one of auto, checkpoint, random")
    gen_dir = resolve_checkpoint(model["generator"]["hf_name"], "generator")
    prm_dir = resolve_checkpoint(model["prm"]["hf_name"], "prm")
    try:
        # The PRM first, then the generator: the KV pool is sized from what both left free.
        prm = ProcessRewardModel(
            prm_dir, dtype=dtype, device=device, prm_format=PRM_FORMATS[fmt_name],
            max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
            max_model_len=int(prm_max_len) if prm_max_len else None,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise _with_context("prm", prm_dir, exc) from exc
    try:
        runner = ModelRunner(gen_dir, num_blocks=1, block_size=block_size, dtype=dtype, device=device)
    except (FileNotFoundError, ValueError) as exc:
        raise _with_context("generator", gen_dir, exc) from exc
    allocate_kv(cfg, runner)
    return runner, prm


def _random_config(hf_name: str, role: str) -> ModelConfig:
    from specscale.engine.torch.model_configs import config_for

    try:
        return ModelConfig.from_dict(config_for(str(hf_name)), source=f"model.{role}.hf_name={hf_name}")
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"model.load_format=random, model.{role}: {exc}") from exc


def _build_random(cfg, device, dtype, block_size, prm_format, prm_max_len):
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
        max_model_len=int(prm_max_len) if prm_max_len else None, seed=seed + 1,
    )
    runner = ModelRunner(
        None, config=_random_config(model["generator"]["hf_name"], "generator"), load_format="random",
        num_blocks=1, block_size=block_size, dtype=dtype, device=device, seed=seed,
    )
    allocate_kv(cfg, runner)
    return runner, prm


def build_synthetic(cfg: Mapping[str, Any], models=None):
    """engine.synthetic_tokens=true: real models, the sim's synthetic workload and problems."""
    from specscale.engine.sim.build import sim_problems, synthetic_workload
    from specscale.engine.torch.synthetic import SyntheticTorchBackend

    model = cfg["model"]
    workload, problems = synthetic_workload(cfg), sim_problems(cfg)
    runner, prm = models if models is not None else build_models(cfg)
    try:
        backend = SyntheticTorchBackend(
            runner, prm, workload, dict(enumerate(problems)),
            int(model["prm_format"]["prompt_overhead_tokens"]), int(model["prm_format"]["tokens_per_step"]),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return backend, problems


def build_torch(cfg: Mapping[str, Any], models=None):
    """The torch backend and the dataset problems for this cell. models: an already loaded
    (ModelRunner, ProcessRewardModel) pair of this cfg's models, reused with its KV pool
    (and captured decode graphs) as is: the cell's BlockManager starts empty, and stale
    cache contents are overwritten before they are read."""
    from specscale.data.loader import load_problems

    if cfg["engine"].get("synthetic_tokens"):
        return build_synthetic(cfg, models)

    problems = load_problems(cfg["dataset"], n_problems=int(cfg["n_problems"]))  # cheap: fail fast
    if not problems:
        raise ConfigError(f"dataset {cfg['dataset'].get('name')} gave no problems")
    runner, prm = models if models is not None else build_models(cfg)
    try:
        tokenizer = load_tokenizer(runner.model_dir)
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise _with_context("generator", runner.model_dir, exc) from exc
    backend = TorchBackend(runner, prm, tokenizer, dict(enumerate(problems)))
    # Fail before anything runs if a prompt cannot fit the context window.
    longest = max(len(backend.prompt_tokens(p)) for p in problems)
    path_cap = int(cfg["search"]["path_token_cap"])
    if longest + path_cap > backend.max_model_len:
        logger.warning(
            "generator context window %d < longest prompt %d + search.path_token_cap %d: paths that reach "
            "the window end there with EOS", backend.max_model_len, longest, path_cap,
        )
    # The PRM reads the question and the path's text (re-tokenized, plus format tokens).
    longest_path = min(path_cap, backend.max_model_len - min(len(backend.prompt_tokens(p)) for p in problems))
    if longest_path >= prm.max_model_len:
        logger.warning(
            "PRM window %d tokens < the longest possible path (%d generator tokens): scoring such a path "
            "fails; lower search.path_token_cap or set engine.prm_max_len", prm.max_model_len, longest_path,
        )
    return backend, problems
