"""The synthetic workload and problems of a cell: what engine=sim serves, and what the
torch backend's synthetic-token mode (engine.synthetic_tokens=true) serves with real
forward passes, so both see the same tokens and scores."""
from __future__ import annotations

from typing import Any, Mapping

from specscale.engine.synthetic.problems import SimProblem, synthetic_problems
from specscale.engine.synthetic.workload import SyntheticWorkload, WorkloadParams
from specscale.settings import CellSpec
from specscale.settings.search_policy import ConfigError


def synthetic_workload(spec: CellSpec) -> SyntheticWorkload:
    """The synthetic workload of engine.synthetic with the model pair's own values
    (``model.sim.workload``: step lengths, steps, error rates of that pair) on top; shared
    by engine=sim and the torch backend's synthetic-token mode, so both see the same
    tokens and scores. A pair's value wins over the engine profile's: set it with
    ``model.sim.workload.<key>=...``."""
    cfg = spec.resolved()
    overrides = dict(cfg["engine"].get("synthetic") or {})
    overrides.update((cfg["model"].get("sim") or {}).get("workload") or {})
    if overrides.get("exact_one_share") is None:  # a property of the generator-PRM pair
        overrides["exact_one_share"] = cfg["model"]["sim"]["exact_one_share"]
    try:
        params = WorkloadParams.from_config(overrides)
    except ValueError as exc:
        raise ConfigError(f"engine.synthetic: {exc}") from exc
    return SyntheticWorkload(params, float(spec.search.temperature))


def sim_problems(spec: CellSpec) -> list[SimProblem]:
    """The cell's synthetic problems: means from dataset.sim, spread from engine.problems,
    the prompt template's length from model.sim.prompt_template_tokens."""
    ds, spread = spec.config["dataset"], spec.config["engine"].get("problems") or {}
    template = int((spec.config["model"].get("sim") or {}).get("prompt_template_tokens") or 0)
    return synthetic_problems(
        spec.dataset.name, int(spec.n_problems), float(ds["sim"]["difficulty_mean"]), float(ds["sim"]["prompt_tokens_mean"]),
        float(spread.get("difficulty_concentration", 4.0)), float(spread.get("prompt_tokens_sigma", 0.35)), template,
    )


def prm_format_tokens(model: Mapping[str, Any]) -> tuple[int, int, int]:
    """(head overhead, tokens per step, closing tokens) the PRM format adds (model.prm_format)."""
    f = model["prm_format"]
    return int(f["prompt_overhead_tokens"]), int(f["tokens_per_step"]), int(f.get("closing_tokens", 0))
