"""Attention backends over the paged KV cache.

``AttentionBackend`` is the interface: ``plan`` runs once per model forward
(FlashInfer's plan/run split: index building is shared by all layers),
``forward`` runs once per layer. ``TorchAttentionBackend`` is the portable
reference: pure torch, CPU or CUDA, any float dtype.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specscale.engine.torch.attention import cpu_paged_decode as cpu_paged_decode_kernel
from specscale.engine.torch.attention.batch import AttentionBatch
from specscale.engine.to_device import copy_to, to_device
from specscale.engine.torch.attention.static_decode import StaticDecode

LayerKV = tuple[torch.Tensor, torch.Tensor]  # K, V caches [num_blocks, block_size, kv_heads, head_dim]


class AttentionBackend(ABC):
    """Causal attention of each row's new tokens over its cached prefix and themselves."""

    name: str = "abstract"

    def provenance(self) -> dict:
        """The attention path this backend runs (``path``: the engine.attention value that
        asks for it), for the summary's provenance."""
        return {"path": self.name}

    @abstractmethod
    def plan(self, batch: AttentionBatch) -> Any:
        """Backend-specific per-batch state, passed back to every ``forward``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, heads, head_dim], RoPE applied
        k: torch.Tensor,  # [T, kv_heads, head_dim], RoPE applied
        v: torch.Tensor,  # [T, kv_heads, head_dim]
        kv_cache: LayerKV | None,
        plan: Any,
        scale: float,
    ) -> torch.Tensor:
        """Write k/v of the new tokens into ``kv_cache`` at ``batch.slot_mapping``
        (if the batch uses the cache), then return attention output [T, heads, head_dim]."""

    # ---- CUDA-graph decode (cuda_graph.py): fixed-shape buckets of rows x KV pages
    def decode_pages_bucket(self, pages: int, max_pages: int, rows: int, block_size: int) -> int | None:
        """The page width of the static buffers serving a decode batch whose longest row
        reads ``pages`` pages; None = no static bucket (the batch runs eagerly). Default: the
        next of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (a plan over fixed-width block tables reads
        all of them, so a bucket wastes at most a third; two buckets per doubling)."""
        width = pages if pages <= 2 else 1 << (pages - 1).bit_length()
        if pages > 2 and 3 * width // 4 >= pages:
            width = 3 * width // 4
        width = min(width, max_pages)
        return width if width >= pages else None

    @abstractmethod
    def static_decode(self, rows: int, pages: int, block_size: int, device: torch.device) -> StaticDecode:
        """Buffers + graph-safe plan for decode batches of ``rows`` rows within ``pages`` pages."""


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: LayerKV | None, slot_mapping: torch.Tensor) -> LayerKV:
    """Store the new tokens' K/V at their cache slots; returns the layer's (K, V) caches."""
    if kv_cache is None:
        raise ValueError("batch has a slot mapping but no KV cache was given")
    k_cache, v_cache = kv_cache
    kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)
    return k_cache, v_cache


@dataclass(frozen=True)
class _RowGroup:
    """Rows attended together: decode rows (one query each) or cached prefill rows
    (padded to [rows, q_len] queries). Keys are gathered whole blocks ([rows, n_keys],
    n_keys = blocks * block_size >= k_len); keys past a row's context are masked."""

    token_index: torch.Tensor | None  # [Tg] flat token indices of the group's tokens; None = all, in order
    pad_index: torch.Tensor | None  # [Tg] where each lands in the padded [rows * q_len] layout (prefill)
    rows: int
    q_len: int
    k_len: int  # longest context of the group
    block_ids: torch.Tensor  # [rows * blocks] int64, flattened block tables (gathered with index_select)
    n_keys: int
    mask: torch.Tensor | None  # [rows, 1, 1 | q_len, n_keys] bool, True = may attend (None: host_context)
    additive: dict = field(default_factory=dict, compare=False)  # dtype -> the mask as 0 / -inf
    # CPU decode rows: each row's context length (numpy), from which the additive mask is
    # cut directly (``decode_additive_mask``) instead of from a bool mask made in the plan.
    host_context: np.ndarray | None = None
    # CPU decode rows with the paged decode kernel (cpu_paged_decode.py): their block tables
    # [rows, width] and context lengths [rows], both int32; the keys are read in place.
    tables: torch.Tensor | None = None
    context: torch.Tensor | None = None

    def additive_mask(self, dtype: torch.dtype, group: int = 1) -> torch.Tensor:
        """The mask in the query dtype, converted once per forward instead of by SDPA in
        every layer (and never mixed-dtype: SDPA mishandles a float32 mask on float64).
        group > 1 (prefill rows): repeated for query heads folded into the query axis,
        ordered (head in group, query position)."""
        m = self.additive.get((dtype, group))
        if m is None and self.host_context is not None and dtype in _NUMPY_FLOAT:
            m = self.additive[(dtype, group)] = decode_additive_mask(self.host_context, self.n_keys, dtype)
        if m is None:
            mask = self.mask if self.mask is not None else self._bool_mask()
            if group > 1 and self.q_len > 1:
                r, _, q, k = mask.shape
                mask = mask.unsqueeze(2).expand(r, 1, group, q, k).reshape(r, 1, group * q, k)
            zero = torch.zeros((), dtype=dtype, device=mask.device)
            m = self.additive[(dtype, group)] = torch.where(mask, zero, float("-inf"))  # one pass, no fill
        return m

    def _bool_mask(self) -> torch.Tensor:
        keys = np.arange(self.n_keys, dtype=np.int64)[None, :]
        return torch.from_numpy(keys < self.host_context.astype(np.int64)[:, None])[:, None, None, :]


def key_block_ids(tables: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """The first ``n_blocks`` of each row's table, flattened, as the gather's int64 ids.
    -1 padding only occurs past a row's own keys (masked): any valid block will do."""
    return tables[:, :n_blocks].clamp_min(0).to(torch.long).reshape(-1)


_NUMPY_FLOAT = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def decode_additive_mask(context: np.ndarray, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 1, 1, n_keys] additive mask (0 for a row's first ``context[r]`` keys, -inf after).

    Row r is the window [n_keys - context[r], 2 * n_keys - context[r]) of one ramp of n_keys
    zeros then n_keys -inf: one gather of whole rows (a memcpy each), ~10x faster on the
    CPU than comparing key indices with the lengths and then selecting 0 / -inf."""
    ramp = np.zeros(2 * n_keys, dtype=_NUMPY_FLOAT[dtype])
    ramp[n_keys:] = -np.inf
    windows = np.lib.stride_tricks.sliding_window_view(ramp, n_keys)
    offsets = n_keys - np.minimum(np.asarray(context, dtype=np.int64), n_keys)
    return torch.from_numpy(windows[offsets])[:, None, None, :]


@dataclass(frozen=True)
class TorchAttentionPlan:
    slot_mapping: torch.Tensor | None  # [T] cache slot per new token; None = no KV cache
    groups: tuple[_RowGroup, ...]
    causal_spans: tuple[tuple[int, int], ...] = ()  # no-cache batches: (first token, length) per row
    # Cached batches: rows with nothing cached yet and several new tokens (a fresh prompt):
    # (first token, length). Their keys are their own new tokens, so they attend causally to
    # those directly, as no-cache rows do, without gathering blocks or a padded mask.
    fresh_spans: tuple[tuple[int, int], ...] = ()
    cu_seqlens: torch.Tensor | None = None  # no-cache batches: [R+1] int32 row starts (varlen kernel)


class TorchAttentionBackend(AttentionBackend):
    """Gather each row's keys through its block table and run SDPA.

    * Decode rows (1 new token) form one group. Keys are gathered by whole blocks with
      one ``index_select``; grouped-query heads are folded into the query axis
      ([rows, kv_heads, heads/kv_heads, d]), so K/V are never expanded per head.
    * Cached prefill chunks form a second group, padded to the longest chunk, so a long
      chunk does not inflate every decode row to its query length.
    * No-cache rows (PRM scoring) run one causal SDPA per row over its own tokens:
      no padding, no mask tensor, whatever the spread of lengths.
    """

    name = "torch"

    def __init__(self, use_varlen: bool = True, cpu_paged_decode: bool = False):
        # No-cache batches of several rows (PRM scoring) on CUDA in half precision: one
        # varlen flash-attention call per layer instead of one SDPA per row, where the
        # installed torch has it (torch.nn.attention.varlen).
        self.use_varlen = use_varlen
        # CPU decode rows read the paged cache in place (cpu_paged_decode.py) instead of
        # gathering it: engine.attention=cpu_kernel only. Asked for, it must build here
        # (KernelUnavailable otherwise): falling back would change a run's numerics silently.
        self.kernel_build = cpu_paged_decode_kernel.require() if cpu_paged_decode else None
        self.cpu_paged_decode = cpu_paged_decode
        self._workspace: dict[tuple, torch.Tensor] = {}

    def provenance(self) -> dict:
        if not self.cpu_paged_decode:
            return {"path": "torch"}
        return {"path": "cpu_kernel", "kernel": self.kernel_build.as_dict()}

    def plan(self, batch: AttentionBatch) -> TorchAttentionPlan:
        if not batch.uses_kv_cache:
            cu = batch.host_cu_seqlens()
            spans = tuple((cu[r], q) for r, q in enumerate(batch.query_lens))
            return TorchAttentionPlan(slot_mapping=None, groups=(), causal_spans=spans, cu_seqlens=batch.cu_seqlens_q)
        qlens = batch.query_lens
        if max(qlens) == 1:  # a pure decode batch: no per-row split
            return TorchAttentionPlan(slot_mapping=batch.slot_mapping, groups=(self._plan_decode(batch, None),))
        starts = batch.start_positions
        decode = [r for r, q in enumerate(qlens) if q == 1]
        prefill = [r for r, q in enumerate(qlens) if q > 1 and starts[r] > 0]
        fresh = [r for r, q in enumerate(qlens) if q > 1 and starts[r] == 0]
        groups = []
        if decode:
            groups.append(self._plan_decode(batch, decode))
        if prefill:
            groups.append(self._plan_prefill(batch, prefill))
        cu = batch.host_cu_seqlens() if fresh else ()
        return TorchAttentionPlan(slot_mapping=batch.slot_mapping, groups=tuple(groups),
                                  fresh_spans=tuple((cu[r], qlens[r]) for r in fresh))

    @staticmethod
    def _tables(batch: AttentionBatch, rows: list[int], all_rows: bool, k_len: int) -> tuple[torch.Tensor, int]:
        n_blocks = -(-k_len // batch.block_size)
        tables = batch.block_tables if all_rows else batch.block_tables[rows]
        return key_block_ids(tables, n_blocks), n_blocks * batch.block_size

    def _plan_decode(self, batch: AttentionBatch, rows: list[int] | None) -> _RowGroup:
        """rows: the decode rows (None: every row of the batch)."""
        dev = batch.device
        all_rows = rows is None or len(rows) == batch.num_rows
        if all_rows:
            rows = range(batch.num_rows)
            k_len = max(batch.start_positions) + 1
            ctx_t = batch.context_lens
        else:
            ctx = [batch.start_positions[r] + 1 for r in rows]
            k_len = max(ctx)
            ctx_t = to_device(ctx, torch.int32, dev)
        token_index = None
        if not all_rows:
            cu = batch.host_cu_seqlens()
            token_index = to_device([cu[r] for r in rows], torch.long, dev)
        if dev.type == "cpu" and self.cpu_paged_decode:  # keys read in place: nothing to gather
            tables = batch.block_tables if all_rows else batch.block_tables[list(rows)]
            n_keys = -(-k_len // batch.block_size) * batch.block_size
            return _RowGroup(token_index, None, len(rows), 1, k_len, None, n_keys, None, host_context=ctx_t.numpy(),
                             tables=tables, context=ctx_t)
        block_ids, n_keys = self._tables(batch, rows, all_rows, k_len)
        if dev.type == "cpu":  # the mask is cut from the lengths when the forward asks for it
            return _RowGroup(token_index, None, len(rows), 1, k_len, block_ids, n_keys, None,
                             host_context=ctx_t.numpy())
        mask = torch.arange(n_keys, device=dev)[None, :] < ctx_t[:, None]
        return _RowGroup(token_index, None, len(rows), 1, k_len, block_ids, n_keys, mask[:, None, None, :])

    def _plan_prefill(self, batch: AttentionBatch, rows: list[int]) -> _RowGroup:
        dev = batch.device
        qlens = [batch.query_lens[r] for r in rows]
        starts = [batch.start_positions[r] for r in rows]
        q_len = max(qlens)
        k_len = max(s + q for s, q in zip(starts, qlens))
        block_ids, n_keys = self._tables(batch, rows, False, k_len)
        cu = batch.host_cu_seqlens()
        token_index, pad_index, q_pos = [], [], []
        for g, (r, q, s) in enumerate(zip(rows, qlens, starts)):
            token_index.extend(range(cu[r], cu[r] + q))
            pad_index.extend(range(g * q_len, g * q_len + q))
            # Padding queries repeat the row's last position: they see only real
            # keys (no all-masked rows, hence no NaN) and their output is dropped.
            q_pos.append([s + min(i, q - 1) for i in range(q_len)])
        q_pos_t = to_device(q_pos, torch.long, dev)
        mask = torch.arange(n_keys, device=dev)[None, None, :] <= q_pos_t[:, :, None]
        return _RowGroup(
            token_index=to_device(token_index, torch.long, dev),
            pad_index=to_device(pad_index, torch.long, dev),
            rows=len(rows), q_len=q_len, k_len=k_len, block_ids=block_ids, n_keys=n_keys, mask=mask.unsqueeze(1),
        )

    def forward(self, q, k, v, kv_cache, plan: TorchAttentionPlan, scale: float) -> torch.Tensor:
        num_heads, head_dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        if plan.slot_mapping is None:
            if self.use_varlen and len(plan.causal_spans) > 1 and varlen_usable(q):
                return varlen_causal(q, k, v, plan.cu_seqlens, max(n for _, n in plan.causal_spans), scale)
            return self._causal_rows(q, k, v, plan.causal_spans, scale)
        k_cache, v_cache = write_kv(k, v, kv_cache, plan.slot_mapping)
        group = num_heads // kv_heads

        out = None
        for grp in plan.groups:
            if grp.tables is not None and cpu_paged_decode_kernel.usable(q, k_cache, v_cache):  # keys read in place
                qg = q if grp.token_index is None else q.index_select(0, grp.token_index)
                og = cpu_paged_decode_kernel.paged_decode(qg, k_cache, v_cache, grp.tables, grp.context, scale)
            elif grp.q_len == 1:
                block_ids = (grp.block_ids if grp.block_ids is not None  # (a kernel plan, a dtype it does not take)
                             else key_block_ids(grp.tables, grp.n_keys // k_cache.shape[1]))
                kg, vg = self._gathered(k_cache, v_cache, block_ids, grp.rows, grp.n_keys)
                qg = q if grp.token_index is None else q.index_select(0, grp.token_index)
                # Heads h = j * group + i read kv head j: fold the group into the query axis.
                og = F.scaled_dot_product_attention(
                    qg.view(grp.rows, kv_heads, group, head_dim), kg, vg, attn_mask=grp.additive_mask(q.dtype),
                    scale=scale,
                ).reshape(grp.rows, num_heads, head_dim)
            else:
                # Query heads folded into the query axis as in decode ([rows, kv_heads,
                # group * q_len, d]): no grouped-query flag, which on CUDA would force SDPA's
                # math kernel whenever a mask is given.
                kg, vg = self._gathered(k_cache, v_cache, grp.block_ids, grp.rows, grp.n_keys)
                r, ql = grp.rows, grp.q_len
                qg = self._pad(q, grp).view(r, ql, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
                og = F.scaled_dot_product_attention(
                    qg.reshape(r, kv_heads, group * ql, head_dim), kg, vg,
                    attn_mask=grp.additive_mask(q.dtype, group), scale=scale,
                )
                og = og.view(r, kv_heads, group, ql, head_dim).permute(0, 3, 1, 2, 4)
                og = og.reshape(r * ql, num_heads, head_dim).index_select(0, grp.pad_index)
            if grp.token_index is None:  # a pure decode batch: its one group holds every row
                return og
            if out is None:
                out = torch.empty_like(q)
            out.index_copy_(0, grp.token_index, og)
        if plan.fresh_spans:
            out = self._causal_rows(q, k, v, plan.fresh_spans, scale, torch.empty_like(q) if out is None else out)
        return out

    def _gathered(self, k_cache, v_cache, block_ids, rows: int, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's keys and values gathered out of the paged cache, [rows, kv_heads, n_keys, d]."""
        n_blocks, _, kv_heads, head_dim = k_cache.shape
        shape = (rows, n_keys, kv_heads, head_dim)
        kg = self._gather(k_cache.view(n_blocks, -1), block_ids, 0).view(shape).transpose(1, 2)
        vg = self._gather(v_cache.view(n_blocks, -1), block_ids, 1).view(shape).transpose(1, 2)
        return kg, vg

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor, slot: int) -> torch.Tensor:
        """``cache.index_select(0, block_ids)``. On the CPU into a reused workspace (K: slot 0,
        V: slot 1): a fresh tensor of every layer's gathered keys (tens of MB at 256 rows) is
        fresh memory from the OS each time, and its page faults cost ~4x the copy itself.
        Each layer's gather is consumed by its attention before the next layer's overwrites it.
        Not on CUDA: the caching allocator already reuses memory, and a graph captured over a
        workspace that later grows would read freed memory."""
        if cache.device.type != "cpu":
            return cache.index_select(0, block_ids)
        n, width = block_ids.numel(), cache.shape[1]
        key = (slot, cache.dtype)
        buf = self._workspace.get(key)
        if buf is None or buf.numel() < n * width:
            buf = self._workspace[key] = torch.empty(max(n * width, 2 * (buf.numel() if buf is not None else 0)),
                                                     dtype=cache.dtype)
        return torch.index_select(cache, 0, block_ids, out=buf[: n * width].view(n, width))

    # Gathered keys per static bucket: beyond this, a batch runs eagerly rather than
    # padding rows x pages into a huge fixed gather (the eager plan gathers only its rows' keys).
    max_static_keys = 1 << 22

    def decode_pages_bucket(self, pages: int, max_pages: int, rows: int, block_size: int) -> int | None:
        width = super().decode_pages_bucket(pages, max_pages, rows, block_size)
        return width if width is not None and rows * width * block_size <= self.max_static_keys else None

    def static_decode(self, rows: int, pages: int, block_size: int, device: torch.device) -> "TorchStaticDecode":
        return TorchStaticDecode(rows, pages, block_size, device)

    @staticmethod
    def _causal_rows(q, k, v, spans, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """Each row (first token, length) attends causally to its own tokens only; into ``out``
        (rows not in ``spans`` untouched). Inputs go to SDPA as [1, heads, tokens, head_dim]:
        its fused kernels (the CPU's flash attention among them) take 4-d inputs only, and 3-d
        ones fall back to the math kernel, which materialises the scores (2-3x slower)."""
        gqa = q.shape[1] != k.shape[1]

        def attend(sl):
            return F.scaled_dot_product_attention(
                q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None], v[sl].transpose(0, 1)[None],
                is_causal=True, scale=scale, enable_gqa=gqa,
            )[0].transpose(0, 1)

        if out is None:
            if len(spans) == 1 and spans[0] == (0, q.shape[0]):
                return attend(slice(None))
            out = torch.empty_like(q)
        for first, n in spans:
            sl = slice(first, first + n)
            out[sl] = attend(sl)
        return out

    @staticmethod
    def _pad(x: torch.Tensor, grp: _RowGroup) -> torch.Tensor:
        padded = x.new_zeros(grp.rows * grp.q_len, *x.shape[1:])
        return padded.index_copy_(0, grp.pad_index, x.index_select(0, grp.token_index))


class TorchStaticDecode(StaticDecode):
    """Block tables [rows, pages] and context lengths as buffers; the decode group (keys
    gathered by whole blocks, mask of each row's context) is built from them on the device."""

    def __init__(self, rows: int, pages: int, block_size: int, device: torch.device):
        super().__init__(rows, pages, block_size, device)
        self.block_tables = torch.zeros(rows, pages, dtype=torch.long, device=device)
        self.context_lens = torch.ones(rows, dtype=torch.long, device=device)
        self.key_index = torch.arange(pages * block_size, device=device)

    def _load_attention(self, batch, n, pad_block) -> None:
        # Table entries past a row's context are masked; padding (-1, unused columns and
        # padding rows) points at the scratch block, so every gathered id is valid.
        full = np.full((self.rows, self.pages), pad_block, dtype=np.int64)
        ctx = np.ones(self.rows, dtype=np.int64)
        if n:
            tables = batch.host_block_tables if batch.host_block_tables is not None else batch.block_tables.cpu().numpy()
            width = min(tables.shape[1], self.pages)
            full[:n, :width] = np.where(tables[:, :width] >= 0, tables[:, :width], pad_block)
            ctx[:n] = np.asarray(batch.start_positions, dtype=np.int64) + 1
        copy_to(self.block_tables, full)
        copy_to(self.context_lens, ctx)

    def plan(self) -> TorchAttentionPlan:
        n_keys = self.pages * self.block_size
        mask = (self.key_index[None, :] < self.context_lens[:, None])[:, None, None, :]
        group = _RowGroup(None, None, self.rows, 1, n_keys, self.block_tables.reshape(-1), n_keys, mask)
        return TorchAttentionPlan(slot_mapping=self.slot_mapping, groups=(group,))


@functools.lru_cache(maxsize=None)
def _varlen_api() -> tuple | None:
    """(varlen_attn, how it takes causality) of the installed torch, or None. Its keywords
    changed across releases: ``window_size=(-1, 0)`` (2.12+) or ``is_causal``; grouped-query
    heads need ``enable_gqa`` where the signature has it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = "window_size" if "window_size" in params else ("is_causal" if "is_causal" in params else None)
    return (varlen_attn, causal, "enable_gqa" in params) if causal else None


def varlen_usable(q: torch.Tensor) -> bool:
    api = _varlen_api()
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and api is not None


def varlen_causal(q, k, v, cu_seqlens: torch.Tensor, max_len: int, scale: float) -> torch.Tensor:
    """Causal attention of each row over its own tokens, all rows in one kernel."""
    fn, causal, has_gqa = _varlen_api()
    kwargs = {"scale": scale}
    kwargs.update({"window_size": (-1, 0)} if causal == "window_size" else {"is_causal": True})
    if q.shape[1] != k.shape[1]:
        if has_gqa:
            kwargs["enable_gqa"] = True
        else:  # flash attention reads grouped heads natively only where the API says so
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return fn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)
