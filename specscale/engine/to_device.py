"""Host values to a device tensor without a device synchronisation.

``torch.tensor(values, device="cuda")`` copies from pageable memory, and a pageable
host-to-device copy waits for the stream: one hidden synchronisation per call, several
per forward. Through pinned memory with ``non_blocking=True`` the copy is queued behind the
device's work instead (PyTorch's pinned allocator keeps the host buffer until the copy has
run). On the CPU the tensor is the host array itself where the dtype allows.
"""
from __future__ import annotations

import numpy as np
import torch


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    host = torch.as_tensor(np.asarray(values), dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_to(dst: torch.Tensor, values) -> None:
    """``dst.copy_(values)`` from host values without a hidden synchronisation: on CUDA the
    source is pinned first (``copy_(numpy view, non_blocking=True)`` from pageable memory
    can wait for the stream, as the blocking copy above does)."""
    host = torch.from_numpy(np.ascontiguousarray(values))
    if dst.device.type == "cuda":
        host = host.pin_memory()
    dst.copy_(host, non_blocking=True)
