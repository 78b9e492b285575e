"""A cell's settings, validated once: the cell spec (cell_settings.py) and its parts, the
search and policy configs (search_policy.py), the dataset (dataset.py), vLLM's engine
settings (vllm_engine.py)."""
from specscale.settings.cell_settings import ALL, CellSpec, cell_spec
from specscale.settings.checks import known_top_level_keys, reject_unknown_keys
from specscale.settings.parts import (
    ATTENTION, TRACKING_MODES, WORKLOADS, EngineSpec, ModelSpec, ProvenanceSpec, StoreSpec, TrackingSpec,
    WorkloadSpec,
)

__all__ = [
    "ALL", "ATTENTION", "TRACKING_MODES", "WORKLOADS", "CellSpec", "EngineSpec", "ModelSpec", "ProvenanceSpec",
    "StoreSpec", "TrackingSpec", "WorkloadSpec", "cell_spec", "known_top_level_keys", "reject_unknown_keys",
]
