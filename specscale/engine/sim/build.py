"""Build the simulated backend and its synthetic problems from a composed config."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from specscale.engine.sim.backend import SimBackend
from specscale.engine.sim.profiled import cost_model_for
from specscale.config import ConfigError
from specscale.engine.sim.problems import SimProblem, synthetic_problems
from specscale.engine.sim.workload import SyntheticWorkload, WorkloadParams


def synthetic_workload(cfg: Mapping[str, Any]) -> SyntheticWorkload:
    """The synthetic workload of engine.synthetic (shared by engine=sim and the torch
    backend's synthetic-token mode, so both see the same tokens and scores)."""
    overrides = dict(cfg["engine"].get("synthetic") or {})
    if overrides.get("exact_one_share") is None:  # a property of the generator-PRM pair
        overrides["exact_one_share"] = cfg["model"]["sim"]["exact_one_share"]
    try:
        params = WorkloadParams.from_config(overrides)
    except ValueError as exc:
        raise ConfigError(f"engine.synthetic: {exc}") from exc
    return SyntheticWorkload(params, float(cfg["search"]["temperature"]))


def sim_problems(cfg: Mapping[str, Any]) -> list[SimProblem]:
    """The cell's synthetic problems: means from dataset.sim, spread from engine.problems."""
    ds, spread = cfg["dataset"], cfg["engine"].get("problems") or {}
    return synthetic_problems(
        ds["name"], int(cfg["n_problems"]), float(ds["sim"]["difficulty_mean"]), float(ds["sim"]["prompt_tokens_mean"]),
        float(spread.get("difficulty_concentration", 4.0)), float(spread.get("prompt_tokens_sigma", 0.35)),
    )


def build_sim(cfg: Mapping[str, Any]):
    """The simulated backend and its problems for this cell."""
    # The sim's tensors are a few hundred rows of ~130 logits: intra-op threads only
    # add synchronisation (a sim cell ran 5x slower with them on a busy 2-core box).
    torch.set_num_threads(1)
    model = cfg["model"]
    eng = cfg["engine"]
    cost = cost_model_for(
        model, cfg["hardware"], eng.get("cost"), prm_prefix_cache=bool(eng.get("prm_prefix_cache", True)),
        prm_max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
    )
    problems = sim_problems(cfg)
    backend = SimBackend(
        synthetic_workload(cfg), cost, dict(enumerate(problems)),
        *prm_format_tokens(model),
    )
    return backend, problems


def prm_format_tokens(model: Mapping[str, Any]) -> tuple[int, int, int]:
    """(head overhead, tokens per step, closing tokens) the PRM format adds (model.prm_format)."""
    f = model["prm_format"]
    return int(f["prompt_overhead_tokens"]), int(f["tokens_per_step"]), int(f.get("closing_tokens", 0))
