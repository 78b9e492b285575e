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
* A wrapper's plan is written to its page-locked host buffer and copied to the device
  without waiting; the engine no longer synchronises after each forward, so a wrapper is
  planned again only once the device has taken its previous plan (``_plan``: a wait only
  when several forwards are queued at once, e.g. the chunks of one PRM batch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specscale.engine.torch.attention.backends import AttentionBackend, write_kv
from specscale.engine.torch.attention.batch import AttentionBatch, BatchRow
from specscale.engine.torch.attention.static_decode import StaticDecode

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
    slot_mapping: torch.Tensor | None  # [T] cache slot per new token; None = no KV cache
    wrapper: Any
    kind: str  # "decode" | "prefill" | "ragged"


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cuda"):
        import flashinfer

        self.num_heads, self.num_kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        # One float workspace for every wrapper (they never run concurrently), graph ones
        # included; zeroed, as FlashInfer asks of a workspace before its first use.
        self.workspace = ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_tensor_cores=num_heads != num_kv_heads
        )
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        self._ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        self.scale = head_dim ** -0.5
        self._planned: dict[int, torch.cuda.Event] = {}  # id(wrapper) -> event after its last plan's copy

    def _plan(self, wrapper, *args, **kwargs) -> None:
        """``wrapper.plan``, once the device has copied the wrapper's previous plan. FlashInfer
        writes a plan into the wrapper's page-locked host buffer and queues the copy to the
        device behind the work already on the stream; planning the same wrapper again
        before that copy ran (forwards queued back to back, as a PRM batch's chunks are)
        would overwrite the plan the earlier forward reads. Between engine iterations the
        copy has long run (each iteration waits for the device once): no wait then."""
        done = self._planned.get(id(wrapper))
        if done is not None and not done.query():
            done.synchronize()
        wrapper.plan(*args, **kwargs)
        event = torch.cuda.Event()
        event.record()
        self._planned[id(wrapper)] = event

    def warm_up(self) -> dict[str, float]:
        """Plan and run a tiny decode, cached-prefill and no-cache (ragged) batch once, so
        flashinfer-python builds (nvcc, first use on a machine: minutes) or loads its kernels
        now rather than inside the first measured iteration. Seconds per kind."""
        h, kvh, d, bs, dev = self.num_heads, self.num_kv_heads, self.head_dim, 16, self.device
        cache = tuple(torch.zeros(8, bs, kvh, d, dtype=self.dtype, device=dev) for _ in range(2))
        kinds = {
            "decode": [BatchRow([1], 20, [0, 1]), BatchRow([1], 5, [2])],
            "prefill": [BatchRow(list(range(9)), 7, [3, 4]), BatchRow([1], 3, [5])],
            "ragged": [BatchRow(list(range(30))), BatchRow(list(range(4)))],
        }
        seconds = {}
        for kind, rows in kinds.items():
            batch = AttentionBatch.from_rows(rows, block_size=bs, device=dev)
            t = batch.num_tokens
            q = torch.randn(t, h, d, dtype=self.dtype, device=dev)
            k, v = (torch.randn(t, kvh, d, dtype=self.dtype, device=dev) for _ in range(2))
            t0 = time.perf_counter()
            self.forward(q, k, v, cache if batch.uses_kv_cache else None, self.plan(batch), self.scale)
            torch.cuda.synchronize(dev)
            seconds[kind] = time.perf_counter() - t0
        return seconds

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
            self._plan(self._ragged, p, p, h, kvh, d, causal=True, sm_scale=self.scale,
                       q_data_type=self.dtype, kv_data_type=self.dtype)
            return FlashInferPlan(None, self._ragged, "ragged")
        qo_indptr, kv_indptr, kv_indices, last = paged_indices(batch)
        if batch.max_query_len == 1:
            self.plan_decode(self._decode, kv_indptr, kv_indices, last, batch.block_size)
            return FlashInferPlan(batch.slot_mapping, self._decode, "decode")
        self._plan(
            self._prefill, _pinned(qo_indptr), _pinned(kv_indptr), _pinned(kv_indices), _pinned(last), h, kvh, d,
            batch.block_size, causal=True, sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
        )
        return FlashInferPlan(batch.slot_mapping, self._prefill, "prefill")

    def forward(self, q, k, v, kv_cache, plan: FlashInferPlan, scale: float) -> torch.Tensor:
        if plan.kind == "ragged":
            return plan.wrapper.run(q, k, v)
        return plan.wrapper.run(q, write_kv(k, v, kv_cache, plan.slot_mapping))

    # ---- CUDA-graph decode: FlashInfer plans any lengths on the host, so one bucket per
    # row count serves every context length (its index buffers are sized for the window).
    def decode_pages_bucket(self, pages: int, max_pages: int, rows: int, block_size: int) -> int | None:
        return max_pages if pages <= max_pages else None

    def static_decode(self, rows: int, pages: int, block_size: int, device) -> "FlashInferStaticDecode":
        return FlashInferStaticDecode(self, rows, pages, block_size, device)

    def plan_decode(self, wrapper, kv_indptr, kv_indices, last_page_len, block_size: int) -> None:
        """Decode ``plan`` from host index arrays (pinned copies), query/KV dtypes declared."""
        self._plan(
            wrapper, _pinned(kv_indptr), _pinned(kv_indices), _pinned(last_page_len), self.num_heads, self.num_kv_heads,
            self.head_dim, block_size, pos_encoding_mode="NONE", sm_scale=self.scale,
            q_data_type=self.dtype, kv_data_type=self.dtype,
        )


class FlashInferStaticDecode(StaticDecode):
    """A decode wrapper in CUDA-graph mode over fixed index buffers (rows + 1 indptr,
    rows * pages indices, rows last-page lengths); ``load`` re-plans it on the host."""

    def __init__(self, backend: FlashInferAttentionBackend, rows: int, pages: int, block_size: int, device):
        import flashinfer

        super().__init__(rows, pages, block_size, device)
        self.backend = backend
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            backend.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=backend.num_heads != backend.num_kv_heads,
            paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buffer=torch.zeros(rows * pages, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buffer=torch.zeros(rows, dtype=torch.int32, device=device),
        )

    def _load_attention(self, batch, n, pad_block) -> None:
        if n:
            _, indptr, indices, last = paged_indices(batch)
        else:
            indptr, indices, last = np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        pad = self.rows - n  # padding rows: one page each, the scratch block, holding one token
        indptr = np.concatenate([indptr, indptr[-1] + np.arange(1, pad + 1)])
        indices = np.concatenate([indices, np.full(pad, pad_block, dtype=np.int64)])
        last = np.concatenate([last, np.ones(pad, dtype=np.int64)])
        self.backend.plan_decode(self.wrapper, indptr, indices, last, self.block_size)

    def plan(self) -> FlashInferPlan:
        return FlashInferPlan(self.slot_mapping, self.wrapper, "decode")
