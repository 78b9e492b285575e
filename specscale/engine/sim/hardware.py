"""Accelerator profiles: the three numbers a roofline cost model needs.

Figures are vendor spec-sheet peaks (dense bf16, no sparsity); how much of them is
achievable is a cost-model assumption (CostParams.mfu / bandwidth_efficiency), not a
hardware fact, so it lives there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# HBM capacities on NVIDIA spec sheets ("80GB", "141GB") are binary units:
# nvidia-smi reports 81920 MiB on an A100-SXM4-80GB and 143771 MiB (~140.4 GiB) on an
# H200. Bandwidth (TB/s) and FLOP/s are decimal.
GIB = 1 << 30


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_s: float
    bf16_flops: float

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.hbm_bandwidth_bytes_s <= 0 or self.bf16_flops <= 0:
            raise ValueError(f"hardware profile {self.name!r}: all figures must be positive")

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> "HardwareProfile":
        """From conf/hardware/*.yaml: name, memory_gb (GiB, see GIB), hbm_bandwidth_tb_s, bf16_tflops.
        An optional ``serving`` node (the serving engine's batch defaults on this GPU) is
        read by the engine config (conf/engine/sim_roofline.yaml), not here."""
        expected = {"name", "memory_gb", "hbm_bandwidth_tb_s", "bf16_tflops"}
        keys = set(mapping.keys()) - {"serving"}
        if keys != expected:
            missing, unknown = sorted(expected - keys), sorted(keys - expected)
            raise ValueError(f"hardware config: missing {missing}, unknown {unknown}")
        return cls(
            name=str(mapping["name"]),
            memory_bytes=int(round(float(mapping["memory_gb"]) * GIB)),
            hbm_bandwidth_bytes_s=float(mapping["hbm_bandwidth_tb_s"]) * 1e12,
            bf16_flops=float(mapping["bf16_tflops"]) * 1e12,
        )

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity at which the peak roofline turns from memory- to compute-bound."""
        return self.bf16_flops / self.hbm_bandwidth_bytes_s
