"""FlashInfer attention backend (CUDA only; package ``flashinfer-python``, extra ``gpu``).

Imported lazily (``make_attention_backend``): a CPU machine never imports flashinfer.

* Cached batches: decode-only batches run ``BatchDecodeWithPagedKVCacheWrapper``
  (tensor cores for grouped-query heads); a batch with any prefill chunk runs
  ``BatchPrefillWithPagedKVCacheWrapper`` (causal; decode rows are 1-token chunks).
  The cache layout is ours, ``[num_blocks, block_size, kv_heads, head_dim]`` = FlashInfer's
  NHD with page size = block size (16). New K/V are written with our slot mapping first.
* No-cache batches (PRM scoring): ``BatchPrefillWithRaggedKVCacheWrapper``, causal per row.
* ``plan`` runs once per model forward, outside any CUDA graph, from pinned host index
  arrays (page indptr / indices / last-page lengths), with the query and KV dtypes
  declared explicitly (bf16 queries on a bf16 cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specscale.engine.torch.attention import AttentionBackend
from specscale.engine.torch.attention_batch import AttentionBatch

WORKSPACE_BYTES = 256 << 20


def flashinfer_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA/JIT install: fall back to torch
        return False
    return True


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).pin_memory()


def paged_indices(batch: AttentionBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host (qo_indptr, kv_indptr, kv_indices, kv_last_page_len) of a cached batch."""
    bs = batch.block_size
    qlen = np.asarray(batch.query_lens, dtype=np.int64)
    ctx = np.asarray(batch.start_positions, dtype=np.int64) + qlen
    pages = -(-ctx // bs)
    tables = batch.host_block_tables
    if tables is None:
        tables = batch.block_tables.cpu().numpy()
    valid = np.arange(tables.shape[1])[None, :] < pages[:, None]
    kv_indices = tables[valid]  # row-major: each row's first `pages` blocks, rows in order
    kv_indptr = np.zeros(len(pages) + 1, dtype=np.int64)
    np.cumsum(pages, out=kv_indptr[1:])
    qo_indptr = np.zeros(len(qlen) + 1, dtype=np.int64)
    np.cumsum(qlen, out=qo_indptr[1:])
    last = ctx - (pages - 1) * bs
    return qo_indptr, kv_indptr, kv_indices, last


@dataclass
class FlashInferPlan:
    batch: AttentionBatch
    wrapper: Any
    kind: str  # "decode" | "prefill" | "ragged"


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cuda"):
        import flashinfer

        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        # One float workspace for every wrapper (they never run concurrently), graph ones included.
        self.workspace = ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_tensor_cores=num_heads != num_kv_heads
        )
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        self._ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        self.scale = head_dim ** -0.5

    @classmethod
    def for_config(cls, config, dtype: torch.dtype, device) -> "FlashInferAttentionBackend":
        return cls(config.num_attention_heads, config.num_key_value_heads, config.head_dim, dtype, device)

    def plan(self, batch: AttentionBatch) -> FlashInferPlan:
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if not batch.uses_kv_cache:
            qlen = np.asarray(batch.query_lens, dtype=np.int64)
            indptr = np.zeros(len(qlen) + 1, dtype=np.int64)
            np.cumsum(qlen, out=indptr[1:])
            p = _pinned(indptr)
            self._ragged.plan(p, p, h, kvh, d, causal=True, sm_scale=self.scale,
                              q_data_type=self.dtype, kv_data_type=self.dtype)
            return FlashInferPlan(batch, self._ragged, "ragged")
        qo_indptr, kv_indptr, kv_indices, last = paged_indices(batch)
        if batch.max_query_len == 1:
            self._decode.plan(
                _pinned(kv_indptr), _pinned(kv_indices), _pinned(last), h, kvh, d, batch.block_size,
                pos_encoding_mode="NONE", sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
            )
            return FlashInferPlan(batch, self._decode, "decode")
        self._prefill.plan(
            _pinned(qo_indptr), _pinned(kv_indptr), _pinned(kv_indices), _pinned(last), h, kvh, d,
            batch.block_size, causal=True, sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
        )
        return FlashInferPlan(batch, self._prefill, "prefill")

    def forward(self, q, k, v, kv_cache, plan: FlashInferPlan, scale: float) -> torch.Tensor:
        batch = plan.batch
        if plan.kind == "ragged":
            return plan.wrapper.run(q, k, v)
        if kv_cache is None:
            raise ValueError("batch has a slot mapping but no KV cache was given")
        k_cache, v_cache = kv_cache
        kvh, d = k.shape[1], k.shape[2]
        k_cache.view(-1, kvh, d).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, kvh, d).index_copy_(0, batch.slot_mapping, v)
        return plan.wrapper.run(q, (k_cache, v_cache))
