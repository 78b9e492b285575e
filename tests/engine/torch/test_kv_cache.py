"""Paged KV cache storage: layout, block copies, memory accounting."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.torch.model_config import load_model_config
from specscale.engine.torch.attention.kv_cache import PagedKVCache


def make_cache():
    cache = PagedKVCache(num_layers=3, num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32)
    cache.kv.copy_(torch.randn_like(cache.kv))
    return cache


def test_layout():
    cache = make_cache()
    k, v = cache.layer(1)
    assert k.shape == v.shape == (6, 4, 2, 8)
    assert k.data_ptr() == cache.kv[0, 1].data_ptr() and v.data_ptr() == cache.kv[1, 1].data_ptr()


def test_copy_block_all_layers_k_and_v():
    cache = make_cache()
    before = cache.kv.clone()
    cache.copy_block(2, 5)
    assert torch.equal(cache.kv[:, :, 5], before[:, :, 2])
    untouched = [b for b in range(6) if b != 5]
    assert torch.equal(cache.kv[:, :, untouched], before[:, :, untouched])


def test_copy_many_blocks_with_overlap():
    cache = make_cache()
    before = cache.kv.clone()
    cache.copy_block([0, 1], [1, 3])  # reads happen before writes
    assert torch.equal(cache.kv[:, :, 1], before[:, :, 0])
    assert torch.equal(cache.kv[:, :, 3], before[:, :, 1])


def test_copy_block_errors():
    cache = make_cache()
    with pytest.raises(ValueError, match="block id 6 out of range"):
        cache.copy_block(0, 6)
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        cache.copy_block([0, 1], [2])
    with pytest.raises(ValueError, match="duplicate destination"):
        cache.copy_block([0, 1], [2, 2])


def test_memory_accounting(tiny):
    cfg = load_model_config(tiny["llama"])
    per_block = PagedKVCache.bytes_per_block(cfg, 16, torch.bfloat16)
    assert per_block == 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * cfg.head_dim * 2
    assert PagedKVCache.blocks_for_budget(cfg, 10 * per_block + 1, 16, torch.bfloat16) == 10
    cache = PagedKVCache.for_model(cfg, 10, 16, torch.bfloat16)
    assert cache.kv.numel() * cache.kv.element_size() == 10 * per_block


def _anon_huge_kb() -> int | None:
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))
    except (OSError, StopIteration):
        return None


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


def test_cpu_cache_is_zeroed_and_backed_by_huge_pages_where_the_os_allows():
    before = _anon_huge_kb()
    # 96 MB: above glibc's largest mmap threshold (32 MB), so fresh memory, as a serving
    # cache is; a smaller one may reuse heap pages an earlier test already touched
    cache = PagedKVCache(2, 6144, 16, 1, 64, torch.float32)
    assert cache.kv.count_nonzero() == 0  # still zero-initialised (advice, then the write)
    if before is None or _thp_mode() == "never":
        pytest.skip(f"no transparent huge pages here (mode {_thp_mode()})")
    # Most of it lies in 2 MB pages (only the unaligned edges keep 4 KB ones)
    assert _anon_huge_kb() - before >= 88 * 1024


def test_only_the_whole_2mb_pages_inside_a_cpu_tensor_are_advised(monkeypatch):
    from specscale.engine.torch.attention import huge_pages

    calls = []
    monkeypatch.setattr(huge_pages, "_madvise", lambda: lambda addr, length, advice: calls.append((addr, length)) or 0)
    t = torch.empty(3 << 20)  # 12 MB
    assert huge_pages.advise_huge_pages(t) is True
    (addr, length), = calls
    start, end, page = t.data_ptr(), t.data_ptr() + (12 << 20), huge_pages.HUGE_PAGE
    assert addr % page == 0 and length % page == 0 and start <= addr and addr + length <= end
    assert addr - start < page and end - (addr + length) < page  # the whole interior
    calls.clear()
    assert huge_pages.advise_huge_pages(torch.empty(1000)) is False and not calls  # no whole page inside
