"""The cell spec (cell.py) and its parts: see specscale/spec/cell.py."""
from specscale.spec.cell import ALL, CellSpec, cell_spec
from specscale.spec.checks import known_top_level_keys, reject_unknown_keys
from specscale.spec.parts import (
    ATTENTION, TRACKING_MODES, WORKLOADS, EngineSpec, ModelSpec, ProvenanceSpec, StoreSpec, TrackingSpec,
    WorkloadSpec,
)

__all__ = [
    "ALL", "ATTENTION", "TRACKING_MODES", "WORKLOADS", "CellSpec", "EngineSpec", "ModelSpec", "ProvenanceSpec",
    "StoreSpec", "TrackingSpec", "WorkloadSpec", "cell_spec", "known_top_level_keys", "reject_unknown_keys",
]
