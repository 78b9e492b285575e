"""CUDA graphs for decode iterations at bucketed batch sizes (CUDA + FlashInfer only).

A decode iteration of a small model is launch-bound: ~10 kernels per layer, each a few
microseconds of work. Capturing the decoder body (embeddings -> final norm) once per
bucket and replaying it removes the launch cost; the LM head stays outside (it runs
only on the rows that want logits, and its shape is the vocabulary's).

Per bucket B (1, 2, 4, 8, 16, 24, 32, ... up to ``max_batch``): static input ids,
positions and slot mapping of B rows, a FlashInfer decode wrapper in CUDA-graph mode
with fixed index buffers, and the captured graph. ``run`` pads a decode batch of n <= B
rows to B (padding rows read and write one reserved scratch block), re-plans the
wrapper outside the graph from pinned host arrays, replays, and returns the first n rows.

The scratch block is one extra block at the end of the KV pool that the scheduler never
sees (``ModelRunner.allocate_kv_cache(..., scratch_block=True)``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from specscale.engine.torch.attention_batch import AttentionBatch
from specscale.engine.torch.flashinfer_attention import FlashInferPlan, _pinned, paged_indices

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(self, runner, buckets=DEFAULT_BUCKETS, max_batch: int = 256):
        import flashinfer

        from specscale.engine.torch.flashinfer_attention import FlashInferAttentionBackend

        if runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if not isinstance(runner.backend, FlashInferAttentionBackend):
            raise ValueError("CUDA graphs need the flashinfer attention backend (its plan is graph-safe)")
        if runner.scratch_block is None:
            raise ValueError("CUDA graphs need a scratch KV block (allocate_kv_cache(..., scratch_block=True))")
        self.runner = runner
        self.buckets = sorted(b for b in buckets if b <= max_batch)
        dev, bs = runner.device, runner.block_size
        self.max_pages = -(-runner.max_model_len // bs)
        self.graphs: dict[int, tuple] = {}
        self.pool = torch.cuda.graph_pool_handle()
        fi = runner.backend
        for b in reversed(self.buckets):  # largest first: smaller graphs reuse its pool memory
            ids = torch.zeros(b, dtype=torch.long, device=dev)
            pos = torch.zeros(b, dtype=torch.long, device=dev)
            slots = torch.full((b,), runner.scratch_block * bs, dtype=torch.long, device=dev)
            ws = fi.workspace
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True, use_tensor_cores=fi.num_heads != fi.num_kv_heads,
                paged_kv_indptr_buffer=torch.zeros(b + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(b * self.max_pages, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.zeros(b, dtype=torch.int32, device=dev),
            )
            plan = FlashInferPlan(SimpleNamespace(slot_mapping=slots), wrapper, "decode")
            self._plan(wrapper, np.arange(b + 1), np.full(b, runner.scratch_block), np.ones(b))
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):  # warm-up outside the graph (lazy inits, autotuning)
                    runner.model(ids, pos, fi, plan, runner.kv_cache)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode():
                out = runner.model(ids, pos, fi, plan, runner.kv_cache)
            self.graphs[b] = (graph, ids, pos, slots, wrapper, out)
        torch.cuda.synchronize(dev)

    def _plan(self, wrapper, indptr, indices, last) -> None:
        fi = self.runner.backend
        wrapper.plan(
            _pinned(indptr), _pinned(indices), _pinned(last), fi.num_heads, fi.num_kv_heads, fi.head_dim,
            self.runner.block_size, pos_encoding_mode="NONE", sm_scale=fi.scale,
            q_data_type=fi.dtype, kv_data_type=fi.dtype,
        )

    def bucket(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def accepts(self, batch: AttentionBatch) -> bool:
        return batch.uses_kv_cache and batch.max_query_len == 1 and self.bucket(batch.num_rows) is not None

    @torch.inference_mode()
    def run(self, batch: AttentionBatch) -> torch.Tensor:
        n = batch.num_rows
        b = self.bucket(n)
        graph, ids, pos, slots, wrapper, out = self.graphs[b]
        ids[:n].copy_(batch.input_ids)
        pos[:n].copy_(batch.positions)
        slots[:n].copy_(batch.slot_mapping)
        if b > n:  # padding rows: token 0 at position 0, written into and read from the scratch block
            ids[n:].zero_()
            pos[n:].zero_()
            slots[n:].fill_(self.runner.scratch_block * self.runner.block_size)
        _, kv_indptr, kv_indices, last = paged_indices(batch)
        pad = b - n
        indptr = np.concatenate([kv_indptr, kv_indptr[-1] + np.arange(1, pad + 1)])
        indices = np.concatenate([kv_indices, np.full(pad, self.runner.scratch_block)])
        self._plan(wrapper, indptr, indices, np.concatenate([last, np.ones(pad, dtype=np.int64)]))
        graph.replay()
        return out[:n]
