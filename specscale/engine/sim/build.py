"""Build the simulated backend and its synthetic problems from a cell spec."""
from __future__ import annotations

import torch

from specscale.engine.sim.backend import SimBackend
from specscale.engine.sim.profiled import cost_model_for
from specscale.engine.synthetic.build import prm_format_tokens, sim_problems, synthetic_workload
from specscale.settings import CellSpec


def build_sim(spec: CellSpec, speed=None):
    """The simulated backend and its problems for this cell. speed: a measured profile's
    SpeedCheck on this machine (specscale/engine/profile_speed.py), applied if it says so."""
    # The sim's tensors are a few hundred rows of ~130 logits: intra-op threads only
    # add synchronisation (a sim cell ran 5x slower with them on a busy 2-core box).
    torch.set_num_threads(1)
    cfg = spec.resolved()  # the cost model's inputs: the pair's dimensions, the modelled GPU, engine.cost
    model = cfg["model"]
    eng = cfg["engine"]
    cost = cost_model_for(
        model, cfg["hardware"], eng.get("cost"), prm_prefix_cache=spec.engine.prm_prefix_cache,
        prm_max_batch_tokens=int(eng.get("prm_max_batch_tokens") or 8192),
        max_num_batched_tokens=spec.engine.max_num_batched_tokens, max_num_seqs=spec.engine.max_num_seqs, speed=speed,
    )
    problems = sim_problems(spec)
    backend = SimBackend(
        synthetic_workload(spec), cost, dict(enumerate(problems)),
        *prm_format_tokens(model),
    )
    return backend, problems
