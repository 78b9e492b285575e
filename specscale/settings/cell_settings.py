"""The cell spec: Hydra's composed config, validated once and frozen.

Every entry point (``run.py``, the ``specscale`` command, the results runner, the
benchmarks through ``build_server``) turns the resolved config into a ``CellSpec``
first, so a bad value fails before anything is built, with a message that names the key
and its allowed range. Everything below the entry (the store and its hash, W&B, the
backend builders, the Server) reads the spec: typed, checked parts for what the harness
itself reads, and the frozen resolved config (``config``) for the hash and for settings
only one builder reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError, PolicyConfig, SearchConfig, check_search_policy
from specscale.settings.dataset import DatasetSpec, spec_from_config
from specscale.settings.checks import check_int, check_number, reject_unknown_keys
from specscale.settings.frozen import freeze, thaw
from specscale.settings.pairings import check_pairing
from specscale.settings.parts import (
    EngineSpec, ModelSpec, ProvenanceSpec, StoreSpec, TrackingSpec, WorkloadSpec,
)

ALL = "all"  # n_problems=all: every row of the dataset


@dataclass(frozen=True)
class CellSpec:
    """One cell of the factorial, validated. ``n_problems`` None means every dataset row."""

    search: SearchConfig
    policy: PolicyConfig
    engine: EngineSpec
    model: ModelSpec
    dataset: DatasetSpec
    workload: WorkloadSpec
    concurrency: int
    seed: int
    n_problems: Optional[int]
    hardware: Optional[str]  # the modelled GPU (engine=sim's cost model); torch/vLLM record the real one
    latency_budgets_s: tuple
    progress: bool
    store: StoreSpec
    tracking: TrackingSpec
    provenance: ProvenanceSpec
    config: Mapping[str, Any]  # the resolved config, deeply read-only (hash, builders, W&B)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "CellSpec":
        """Validate a resolved config (dict, or a DictConfig resolved here) and freeze it."""
        if not isinstance(cfg, dict):
            from omegaconf import OmegaConf

            if OmegaConf.is_config(cfg):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        reject_unknown_keys(cfg)
        search = dict(cfg.get("search") or {})
        # 0 is greedy decoding (engine=vllm's tests use it); negative temperatures are meaningless.
        check_number("search.temperature", search.get("temperature", 0.8), 0.0, low_open=False)
        check_number("search.top_p", search.get("top_p", 1.0), 0.0, 1.0)
        for key in ("max_rounds", "step_token_cap", "path_token_cap"):
            if key in search:
                check_int(f"search.{key}", search[key])
        beam, expansion = check_int("beam", cfg.get("beam")), check_int("expansion", cfg.get("expansion"))
        engine = EngineSpec.from_config(cfg["engine"])
        n_problems = cfg.get("n_problems")
        if n_problems == ALL:
            if engine.name == "sim":
                raise ConfigError("n_problems=all needs a dataset to count: engine=sim synthesizes its problems, "
                                  "set n_problems to a number")
            n_problems = None
        else:
            check_int("n_problems", n_problems)
        try:
            dataset = spec_from_config(cfg["dataset"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        _check_dataset_size(n_problems, dataset, cfg["dataset"].get("problems"))
        check_pairing(cfg)  # model / dataset / workload pairs that compose but mean nothing (pairings.py)
        search_cfg = SearchConfig.from_config({"beam": beam, "expansion": expansion, **search})
        policy = PolicyConfig.from_config(dict(cfg["policy"]))
        check_search_policy(search_cfg, policy)  # a policy switch with nothing to act on in this search
        return cls(
            search=search_cfg,
            policy=policy,
            engine=engine,
            model=ModelSpec.from_config(cfg["model"]),
            dataset=dataset,
            workload=WorkloadSpec.from_config(cfg["workload"]),
            concurrency=check_int("concurrency", cfg.get("concurrency")),
            seed=check_int("seed", cfg.get("seed"), low=0),
            n_problems=n_problems,
            hardware=(cfg.get("hardware") or {}).get("name"),
            latency_budgets_s=tuple((cfg.get("metrics") or {}).get("latency_budgets_s") or ()),
            progress=bool(cfg.get("progress", False)),
            store=StoreSpec(cfg.get("results_dir"), cfg.get("experiment_name")),
            tracking=TrackingSpec.from_config(cfg.get("wandb")),
            provenance=ProvenanceSpec.from_config(cfg["dataset"]),
            config=freeze(cfg),
        )

    def resolved(self) -> dict:
        """The resolved config as plain dicts and lists (config.json/.yaml, the hash, W&B)."""
        return thaw(self.config)


def cell_spec(cell: "CellSpec | Mapping[str, Any]") -> CellSpec:
    """An entry point's argument as a spec: a spec as is, a config validated (once)."""
    return cell if isinstance(cell, CellSpec) else CellSpec.from_config(cell)


def _check_dataset_size(n_problems: Optional[int], dataset: DatasetSpec, size: Any) -> None:
    """n_problems above what the dataset holds is the same error on every engine: the sim
    synthesizes its problems, but a MATH-500 cell of 600 problems describes no experiment.
    Local files (data_files / data_dir) are counted when they are loaded instead."""
    if n_problems is None or size is None or dataset.is_local:
        return
    if n_problems > int(size):
        raise ConfigError(f"n_problems={n_problems} is more than dataset {dataset.name} holds ({size} problems): "
                          f"set n_problems to at most {size}")
