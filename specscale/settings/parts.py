"""The typed parts of a cell spec besides the search and the policy (specscale.settings.search_policy).

Each part reads its own config group once, checks it, and keeps what the harness itself
reads; settings only one engine reads stay in the spec's frozen ``config``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError
from specscale.settings.checks import check_int, check_number

WORKLOADS = ("saturated", "poisson")
ATTENTION = ("auto", "torch", "cpu_kernel", "flashinfer")
TRACKING_MODES = ("disabled", "offline", "online")


# The engines a cell can name (specscale/engine/registry.py builds them).
ENGINE_NAMES = ("sim", "torch", "vllm")


@dataclass(frozen=True)
class EngineSpec:
    """The engine settings every backend shares (the rest stay in ``config['engine']``)."""

    name: str
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: Optional[int]
    prm_kv_blocks: Optional[int]
    prm_prefix_cache: bool
    prefix_caching: bool

    @classmethod
    def from_config(cls, eng: Mapping[str, Any]) -> "EngineSpec":
        name = eng.get("name")
        if name not in ENGINE_NAMES:
            raise ConfigError(f"engine must be one of {sorted(ENGINE_NAMES)} (engine=NAME), got {name!r}")
        spec = cls(
            name=name,
            block_size=check_int("engine.block_size", eng.get("block_size")),
            max_num_seqs=check_int("engine.max_num_seqs", eng.get("max_num_seqs")),
            max_num_batched_tokens=check_int("engine.max_num_batched_tokens", eng.get("max_num_batched_tokens")),
            kv_blocks=check_int("engine.kv_blocks", eng.get("kv_blocks"), null=True),
            prm_kv_blocks=check_int("engine.prm_kv_blocks", eng.get("prm_kv_blocks"), null=True),
            prm_prefix_cache=bool(eng.get("prm_prefix_cache", True)),
            prefix_caching=bool(eng.get("prefix_caching", True)),
        )
        if spec.max_num_batched_tokens < spec.block_size:
            raise ConfigError(f"engine.max_num_batched_tokens ({spec.max_num_batched_tokens}) must be >= "
                              f"engine.block_size ({spec.block_size})")
        if name == "torch":
            _check_torch(eng)
        return spec


def _check_torch(eng: Mapping[str, Any]) -> None:
    for key in ("cpu_kv_blocks", "cpu_prm_kv_blocks", "prm_max_batch_tokens"):
        if key in eng:
            check_int(f"engine.{key}", eng[key])
    for key in ("prm_max_len", "cpu_threads"):
        if key in eng:
            check_int(f"engine.{key}", eng[key], null=True)
    if not isinstance(eng.get("fused_ops", False), bool):
        raise ConfigError(f"engine.fused_ops must be true or false, got {eng.get('fused_ops')!r}")
    if eng.get("attention", "auto") not in ATTENTION:
        raise ConfigError(f"engine.attention must be one of {ATTENTION}, got {eng.get('attention')!r}")
    device = str(eng.get("device") or "auto")
    if device != "auto" and device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"engine.device must be auto, cpu, cuda or cuda:N, got {device!r}")


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    rate: Optional[float]

    @classmethod
    def from_config(cls, wl: Mapping[str, Any]) -> "WorkloadSpec":
        kind = wl.get("kind")
        if kind not in WORKLOADS:
            raise ConfigError(f"workload must be one of {WORKLOADS} (workload=NAME), got {kind!r}")
        rate = wl.get("rate")
        if kind == "poisson":
            rate = check_number("workload.rate (req/s) of workload=poisson", rate, 0.0)
        return cls(kind, None if rate is None else float(rate))


@dataclass(frozen=True)
class ModelSpec:
    """The generator/PRM pair by name; its dimensions and formats stay in ``config['model']``."""

    name: str
    generator: Optional[str]  # model.generator.hf_name
    prm: Optional[str]  # model.prm.hf_name

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> "ModelSpec":
        return cls(str(model["name"]), (model.get("generator") or {}).get("hf_name"),
                   (model.get("prm") or {}).get("hf_name"))


@dataclass(frozen=True)
class StoreSpec:
    """Where the cell's results go: <results_dir>/<experiment>/... (specscale.results.store)."""

    results_dir: Optional[str]
    experiment: Optional[str]


@dataclass(frozen=True)
class TrackingSpec:
    """W&B: one run per cell (specscale.results.tracking)."""

    mode: str
    project: str
    entity: Optional[str]

    @classmethod
    def from_config(cls, wb: Optional[Mapping[str, Any]]) -> "TrackingSpec":
        wb = wb or {}
        mode = wb.get("mode", "disabled")
        if mode not in TRACKING_MODES:
            raise ConfigError(f"wandb.mode must be one of {TRACKING_MODES}, got {mode!r}")
        return cls(mode, wb.get("project") or "specscale", wb.get("entity"))


@dataclass(frozen=True)
class ProvenanceSpec:
    """What a cell's result depends on besides its config, known before it runs: the
    results version (grader and metric code) and a fingerprint of the local data files.
    The hash covers both; the summary's provenance block records them."""

    results_version: int
    source_fingerprint: Optional[str]

    @classmethod
    def from_config(cls, dataset: Mapping[str, Any]) -> "ProvenanceSpec":
        from specscale.settings.fingerprint import source_fingerprint
        from specscale.version import RESULTS_VERSION

        return cls(RESULTS_VERSION, source_fingerprint(dataset))
