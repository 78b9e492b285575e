"""The decoder's elementwise hot ops, as plain functions: eager (the reference) or compiled.

Per layer a decoder runs two RMS norms (each after a residual add), one SiLU x up and one
rotary application. Eagerly each is a chain of small kernels that reads and writes the
activations several times; ``torch.compile`` fuses each chain into one kernel per op
(``engine.fused_ops``, see ``fused_ops.py``). The functions take the weights as arguments
(not bound methods) so one compiled graph serves every layer of every model.

``EAGER_OPS`` computes exactly what the decoder computed before the switch existed (same
operations in the same order, so float64 trees are unchanged). The compiled ops compute the
same formulas, but inductor reduces the norm's mean of squares in its own order: the norm
runs in float32 in every model dtype (as transformers does), so fused and eager agree to
float32 round-off (~1e-7 relative), in float64 models too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from specscale.engine.torch.model.rotary import apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm computed in float32 and cast back before the weight multiply, as
    transformers does (so bf16 and float64 runs match the reference)."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:  # the same math, one fused op
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream step of a pre-norm decoder: residual += x, then the norm of it.
    Returns (normed, new residual)."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[.., 2 * I] = [gate; up] -> silu(gate) * up [.., I] (SwiGLU's activation)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class HotOps:
    """The op set a ``DecoderModel`` calls (its ``hot_ops``)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    compiled: bool = False


EAGER_OPS = HotOps(rms_norm, add_rms_norm, silu_mul, apply_rotary)


def compiled_ops() -> HotOps:
    """The same functions under ``torch.compile``, compiled lazily at their first calls
    (``fused_ops.py`` makes those calls in warm-up).

    Shapes: dynamo's automatic dynamic (not dynamic=True). A size of 1 is always its own
    graph; a call whose token count differs from the one compiled before marks that
    dimension dynamic, so after a 1-token call and an n-token call one graph serves every
    n >= 2 while the model's feature sizes (hidden, intermediate, heads, head_dim) stay
    constants. dynamic=True would make those
    symbolic too: the same graphs count, but kernels with unknown row lengths (measured
    ~1.5x slower for SiLU x up and rotary at 4096 tokens on this CPU). A process serving two
    models of different widths (a generator and a larger PRM) gets feature sizes dynamic in
    the second model's graphs, which the first then shares: correct, somewhat slower.

    Not fullgraph: with it, a process that outgrows dynamo's recompile limit (8 graphs per
    function: dtypes x norm eps x shape class) would fail instead of running the extra
    variant eagerly; these functions have no graph breaks (the tests check)."""

    def compile_(fn):
        return torch.compile(fn)

    return HotOps(compile_(rms_norm), compile_(add_rms_norm), compile_(silu_mul), compile_(apply_rotary),
                  compiled=True)
