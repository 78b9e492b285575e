"""The cell spec: Hydra's composed config, validated once and frozen.

Every entry point (``run.py``, the ``specscale`` command, the benchmarks through
``build_server``) turns the resolved config into a ``CellSpec`` first, so a bad value
fails before anything is built, with a message that names the key and its allowed
range. The spec keeps the plain resolved config (``config``) for the hash and the
builders, and typed, checked views of the parts the harness itself reads.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional

from specscale.config import ConfigError, PolicyConfig, SearchConfig

WORKLOADS = ("saturated", "poisson")
ATTENTION = ("auto", "torch", "flashinfer")
ALL = "all"  # n_problems=all: every row of the dataset


def _int(cfg: Mapping[str, Any], key: str, value: Any, low: int = 1, null: bool = False) -> Optional[int]:
    """value as an int >= low, or a ConfigError naming key (bools and floats are rejected)."""
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        allowed = f"an integer >= {low}" + (" or null" if null else "")
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return value


def _number(key: str, value: Any, low: float, high: Optional[float] = None, low_open: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"{'(' if low_open else '['}{low}"
        hi = f"{high}]" if high is not None else "inf)"
        raise ConfigError(f"{key} must be a number in {lo}, {hi}, got {value!r}")
    return float(value)


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
        from specscale.cell import BACKEND_BUILDERS  # the engines this installation knows

        name = eng.get("name")
        if name not in BACKEND_BUILDERS:
            raise ConfigError(f"engine must be one of {sorted(BACKEND_BUILDERS)} (engine=NAME), got {name!r}")
        spec = cls(
            name=name,
            block_size=_int(eng, "engine.block_size", eng.get("block_size")),
            max_num_seqs=_int(eng, "engine.max_num_seqs", eng.get("max_num_seqs")),
            max_num_batched_tokens=_int(eng, "engine.max_num_batched_tokens", eng.get("max_num_batched_tokens")),
            kv_blocks=_int(eng, "engine.kv_blocks", eng.get("kv_blocks"), null=True),
            prm_kv_blocks=_int(eng, "engine.prm_kv_blocks", eng.get("prm_kv_blocks"), null=True),
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
            _int(eng, f"engine.{key}", eng[key])
    for key in ("prm_max_len", "cpu_threads"):
        if key in eng:
            _int(eng, f"engine.{key}", eng[key], null=True)
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
            rate = _number("workload.rate (req/s) of workload=poisson", rate, 0.0)
        return cls(kind, None if rate is None else float(rate))


@dataclass(frozen=True)
class CellSpec:
    """One cell of the factorial, validated. ``n_problems`` None means every dataset row."""

    search: SearchConfig
    policy: PolicyConfig
    engine: EngineSpec
    workload: WorkloadSpec
    concurrency: int
    seed: int
    n_problems: Optional[int]
    config: Mapping[str, Any]  # the resolved config, read-only (hash, builders, provenance)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "CellSpec":
        reject_unknown_keys(cfg)
        search = dict(cfg.get("search") or {})
        # 0 is greedy decoding (engine=vllm's tests use it); negative temperatures are meaningless.
        _number("search.temperature", search.get("temperature", 0.8), 0.0, low_open=False)
        _number("search.top_p", search.get("top_p", 1.0), 0.0, 1.0)
        for key in ("max_rounds", "step_token_cap", "path_token_cap"):
            if key in search:
                _int(cfg, f"search.{key}", search[key])
        beam, expansion = _int(cfg, "beam", cfg.get("beam")), _int(cfg, "expansion", cfg.get("expansion"))
        engine = EngineSpec.from_config(cfg["engine"])
        n_problems = cfg.get("n_problems")
        if n_problems == ALL:
            if engine.name == "sim":
                raise ConfigError("n_problems=all needs a dataset to count: engine=sim synthesizes its problems, "
                                  "set n_problems to a number")
            n_problems = None
        else:
            _int(cfg, "n_problems", n_problems)
        from specscale.data.spec import spec_from_config

        try:
            spec_from_config(cfg["dataset"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return cls(
            search=SearchConfig.from_config({"beam": beam, "expansion": expansion, **search}),
            policy=PolicyConfig.from_config(dict(cfg["policy"])),
            engine=engine,
            workload=WorkloadSpec.from_config(cfg["workload"]),
            concurrency=_int(cfg, "concurrency", cfg.get("concurrency")),
            seed=_int(cfg, "seed", cfg.get("seed"), low=0),
            n_problems=n_problems,
            config=MappingProxyType(dict(cfg)),
        )


@functools.lru_cache(maxsize=4)
def known_top_level_keys(conf_dir: Optional[str] = None) -> frozenset[str]:
    """The top-level keys of conf/config.yaml: its own settings and its config groups."""
    from omegaconf import OmegaConf

    from specscale.compose import CONF_DIR

    primary = OmegaConf.to_container(OmegaConf.load(Path(conf_dir or CONF_DIR) / "config.yaml"))
    keys = {k for k in primary if k != "defaults"}
    for entry in primary.get("defaults", []):
        if isinstance(entry, dict):
            keys.update(str(k).split("@")[0].split("/")[0].lstrip("+") for k in entry if "hydra" not in str(k))
    return frozenset(keys | {"hydra"})


def reject_unknown_keys(cfg: Mapping[str, Any]) -> None:
    """A misspelt ``+beem=4`` would otherwise run the default beam under a new hash."""
    unknown = sorted(set(cfg) - known_top_level_keys())
    if unknown:
        raise ConfigError(f"unknown top-level setting(s) {unknown} (added with +?); known settings: "
                          f"{sorted(known_top_level_keys() - {'hydra'})}")
