"""``engine.fused_ops``: the compiled hot ops (``hot_ops.py``) for one model pair.

The switch is applied in warm-up, before any clock starts (docs/design.md §6): ``FusedOps.apply``
installs the compiled op set on a model and compiles it right away by running that model
forward at every shape class serving will use (``warm_forwards``), so a served forward only
evaluates dynamo's guards, never compiles. If ``torch.compile`` is unavailable or fails
(no C++ compiler for inductor on the CPU, an unsupported Python, a backend error), the
model keeps the eager ops and one warning names the setting; the generator and the PRM
share one ``FusedOps``, so they fall back together and warn once.

Shape classes: dynamo specialises a dimension of size 1, and a later call whose token count
differs from what it compiled before gets one graph dynamic in the token count (automatic
dynamic, ``hot_ops.compiled_ops``), so a forward of 1 token then one of n >= 2 cover all
batches (decode of any number of rows, prefill chunks, PRM batches).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from specscale.engine.torch.attention.backends import AttentionBackend
from specscale.engine.torch.attention.batch import BatchRow, BatchBuilder
from specscale.engine.torch.model_config import ModelConfig
from specscale.engine.torch.model.hot_ops import EAGER_OPS, HotOps, compiled_ops

SETTING = "engine.fused_ops"
logger = logging.getLogger(__name__)


def warm_lengths(config: ModelConfig) -> tuple[int, int]:
    """Token counts of the forwards that compile every graph serving uses, in this order: 1
    (its own graph), then the smallest n >= 2 equal to none of the model's dimensions (the
    size changed, so dynamo makes it dynamic). Dynamo may tie sizes that are equal at compile
    time together (duck shaping), and a graph compiled at n == head_dim could then be guarded
    on that equality; torch 2.13 does not do it to these ops, but warm-up should not depend
    on that."""
    c = config
    heads, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    dims = {c.hidden_size, c.intermediate_size, 2 * c.intermediate_size, c.vocab_size,
            heads, kv, heads + kv, heads + 2 * kv, d, d // 2}
    n = 2
    while n in dims:
        n += 1
    return 1, n


@torch.inference_mode()
def warm_forwards(model: nn.Module, backend: AttentionBackend, device: torch.device, config: ModelConfig) -> None:
    """No-cache forwards of one dummy row at each ``warm_lengths`` token count (nothing is
    written to a KV cache). Under inference mode, as every served forward: dynamo guards on
    the grad mode."""
    builder = BatchBuilder(16, device, debug_checks=False)
    for n in warm_lengths(config):
        ids = [i % config.vocab_size for i in range(n)]
        batch = builder.from_rows([BatchRow(ids, 0, None)])
        model(batch.input_ids, batch.positions, backend, backend.plan(batch), None)


@dataclass
class FusedOps:
    """The switch for the models of one run. ``enabled``: engine.fused_ops; ``failure``:
    why compiling did not work here (then every model keeps the eager ops)."""

    enabled: bool = False
    failure: str | None = None
    ops: HotOps | None = field(default=None, repr=False)  # the compiled set, shared by the models

    @property
    def active(self) -> bool:
        return self.enabled and self.failure is None

    def apply(self, body: nn.Module, warm: Callable[[], None]) -> bool:
        """Give ``body`` (a ``DecoderModel``) the op set the switch asks for; compiled ops are
        compiled now, by ``warm()`` (forwards of the model that owns ``body``). Returns
        whether its op set changed (CUDA graphs captured before replay the old one)."""
        before = body.hot_ops
        if not self.active:
            body.hot_ops = EAGER_OPS
            return before is not EAGER_OPS
        if before.compiled:
            return False
        try:
            if self.ops is None:
                self.ops = compiled_ops()
            body.hot_ops = self.ops
            warm()
        except Exception as exc:  # any compile failure: the eager ops are the reference anyway
            body.hot_ops = EAGER_OPS
            detail = str(exc).strip().splitlines()
            self.failure = f"{type(exc).__name__}: {detail[0] if detail else ''}"
            logger.warning("%s=true, but torch.compile cannot build the fused ops here (%s); running the eager "
                           "ops (set %s=false to silence this)", SETTING, self.failure, SETTING)
            return before is not EAGER_OPS
        return True
