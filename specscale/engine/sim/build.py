"""Build the simulated backend and its synthetic problems from a cell spec."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from specscale.engine.sim.backend import SimBackend
from specscale.engine.sim.profiled import cost_model_for
from specscale.config import ConfigError
from specscale.engine.sim.problems import SimProblem, synthetic_problems
from specscale.engine.sim.workload import SyntheticWorkload, WorkloadParams
from specscale.spec import CellSpec


def synthetic_workload(spec: CellSpec) -> SyntheticWorkload:
    """The synthetic workload of engine.synthetic (shared by engine=sim and the torch
    backend's synthetic-token mode, so both see the same tokens and scores)."""
    cfg = spec.resolved()
    overrides = dict(cfg["engine"].get("synthetic") or {})
    if overrides.get("exact_one_share") is None:  # a property of the generator-PRM pair
        overrides["exact_one_share"] = cfg["model"]["sim"]["exact_one_share"]
    try:
        params = WorkloadParams.from_config(overrides)
    except ValueError as exc:
        raise ConfigError(f"engine.synthetic: {exc}") from exc
    return SyntheticWorkload(params, float(spec.search.temperature))


def sim_problems(spec: CellSpec) -> list[SimProblem]:
    """The cell's synthetic problems: means from dataset.sim, spread from engine.problems."""
    ds, spread = spec.config["dataset"], spec.config["engine"].get("problems") or {}
    return synthetic_problems(
        spec.dataset.name, int(spec.n_problems), float(ds["sim"]["difficulty_mean"]), float(ds["sim"]["prompt_tokens_mean"]),
        float(spread.get("difficulty_concentration", 4.0)), float(spread.get("prompt_tokens_sigma", 0.35)),
    )


def build_sim(spec: CellSpec):
    """The simulated backend and its problems for this cell."""
    # The sim's tensors are a few hundred rows of ~130 logits: intra-op threads only
    # add synchronisation (a sim cell ran 5x slower with them on a busy 2-core box).
    torch.set_num_threads(1)
    cfg = spec.resolved()  # the cost model's inputs: the pair's dimensions, the modelled GPU, engine.cost
    model = cfg["model"]
    eng = cfg["engine"]
    cost = cost_model_for(
        model, cfg["hardware"], eng.get("cost"), prm_prefix_cache=spec.engine.prm_prefix_cache,
        prm_max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
    )
    problems = sim_problems(spec)
    backend = SimBackend(
        synthetic_workload(spec), cost, dict(enumerate(problems)),
        *prm_format_tokens(model),
    )
    return backend, problems


def prm_format_tokens(model: Mapping[str, Any]) -> tuple[int, int, int]:
    """(head overhead, tokens per step, closing tokens) the PRM format adds (model.prm_format)."""
    f = model["prm_format"]
    return int(f["prompt_overhead_tokens"]), int(f["tokens_per_step"]), int(f.get("closing_tokens", 0))
