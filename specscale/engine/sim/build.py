"""Build the simulated backend and its synthetic problems from a composed config."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from specscale.engine.sim.backend import SimBackend
from specscale.engine.sim.cost_model import CostModel
from specscale.engine.sim.problems import synthetic_problems
from specscale.engine.sim.workload import SyntheticWorkload, WorkloadParams


def build_sim(cfg: Mapping[str, Any]):
    """The simulated backend and its problems for this cell."""
    # The sim's tensors are a few hundred rows of ~130 logits: intra-op threads only
    # add synchronisation (a sim cell ran 5x slower with them on a busy 2-core box).
    torch.set_num_threads(1)
    eng, model, ds = cfg["engine"], cfg["model"], cfg["dataset"]
    overrides = dict(eng.get("synthetic") or {})
    if overrides.get("exact_one_share") is None:  # a property of the generator-PRM pair
        overrides["exact_one_share"] = model["sim"]["exact_one_share"]
    params = WorkloadParams.from_config(overrides)
    workload = SyntheticWorkload(params, float(cfg["search"]["temperature"]))
    cost = CostModel.from_configs(model, cfg["hardware"], eng.get("cost"))
    spread = eng.get("problems") or {}
    problems = synthetic_problems(
        ds["name"], int(cfg["n_problems"]), float(ds["sim"]["difficulty_mean"]), float(ds["sim"]["prompt_tokens_mean"]),
        float(spread.get("difficulty_concentration", 4.0)), float(spread.get("prompt_tokens_sigma", 0.35)),
    )
    backend = SimBackend(
        workload, cost, dict(enumerate(problems)),
        int(model["prm_format"]["prompt_overhead_tokens"]), int(model["prm_format"]["tokens_per_step"]),
    )
    return backend, problems
