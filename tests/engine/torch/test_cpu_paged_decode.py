"""The CPU paged decode kernel (engine.attention=cpu_kernel, opt-in): decode rows reading the
paged KV cache in place agree with the torch reference path (keys gathered, SDPA), in mixed
batches, for grouped and plain heads and head sizes off the 8-lane width; engine.attention=auto
on the CPU is the torch path; asked for without a compiler, the kernel is a clear error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cfg_helpers import compose_cfg
from specscale.cell import build_server, run_cell
from specscale.settings.search_policy import ConfigError
from specscale.engine.torch.attention import cpu_paged_decode as kernel
from specscale.engine.torch.attention.backends import TorchAttentionBackend
from specscale.engine.torch.attention.select import make_attention_backend
from specscale.engine.torch.attention.batch import AttentionBatch, BatchRow

needs_kernel = pytest.mark.skipif(kernel.load() is None, reason=f"no CPU paged decode kernel: {kernel.failure()}")


def caches(num_blocks, block_size, kv_heads, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, dim)
    return torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)


def mixed_rows():
    """Decode rows at contexts inside and across block boundaries, a cached prefill chunk
    and a fresh prompt, on scattered blocks (block size 4)."""
    return [
        BatchRow([1], 0, [7]),  # first token: context 1
        BatchRow([2], 3, [3]),  # fills its block exactly
        BatchRow([3], 4, [11, 2]),  # first token of a new block
        BatchRow(list(range(6)), 5, [5, 9, 12]),  # a chunk over a cached prefix
        BatchRow([4], 29, [0, 13, 14, 15, 16, 17, 18, 19]),
        BatchRow(list(range(9)), 0, [20, 21, 22]),  # a fresh prompt
        BatchRow([5], 10, [23, 24, 25]),
    ]


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 64), (2, 1, 128), (3, 3, 20), (8, 1, 16)])
def test_decode_rows_read_in_place_agree_with_the_gathered_path(dtype, tol, heads, kv_heads, dim):
    rows = mixed_rows()
    batch = AttentionBatch.from_rows(rows, block_size=4)
    n = batch.num_tokens
    g = torch.Generator().manual_seed(1)
    q = torch.randn(n, heads, dim, generator=g, dtype=dtype)
    k = torch.randn(n, kv_heads, dim, generator=g, dtype=dtype)
    v = torch.randn(n, kv_heads, dim, generator=g, dtype=dtype)
    outs = []
    for backend in (TorchAttentionBackend(), TorchAttentionBackend(cpu_paged_decode=True)):
        kc, vc = caches(32, 4, kv_heads, dim, dtype)
        plan = backend.plan(batch)
        outs.append(backend.forward(q, k, v, (kc, vc), plan, dim ** -0.5))
    assert plan.groups[0].tables is not None  # the decode group went through the kernel
    torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_apart_scores_weigh_nothing_not_garbage(dtype):
    """Scores hundreds apart: float32's vectorised exponential clamps what would underflow
    (a wrong clamp gives huge or negative weights), so the output is the top keys' values."""
    rows = [BatchRow([1], 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])]
    batch = AttentionBatch.from_rows(rows, block_size=4)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 64, generator=g, dtype=dtype) * 40  # scores spread over ~+-300
    k, v = (torch.randn(1, 2, 64, generator=g, dtype=dtype) for _ in range(2))
    outs = []
    for backend in (TorchAttentionBackend(), TorchAttentionBackend(cpu_paged_decode=True)):
        kc, vc = caches(12, 4, 2, 64, dtype, seed=3)
        outs.append(backend.forward(q, k, v, (kc, vc), backend.plan(batch), 64 ** -0.5))
    assert outs[1].isfinite().all()
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-5, atol=2e-5)


@needs_kernel
def test_pure_decode_batch_matches_and_plans_no_gather():
    rows = [BatchRow([i], 16 * i + 3, list(range(8 * i, 8 * i + i + 1))) for i in range(5)]
    batch = AttentionBatch.from_rows(rows, block_size=16)
    paged = TorchAttentionBackend(cpu_paged_decode=True)
    grp = paged.plan(batch).groups[0]
    assert grp.block_ids is None and grp.tables.dtype == torch.int32
    assert grp.context.tolist() == [16 * i + 4 for i in range(5)]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, h, 32, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    want = TorchAttentionBackend().forward(q, k, v, caches(48, 16, 2, 32, torch.float64), TorchAttentionBackend().plan(batch),
                                           0.2)
    got = paged.forward(q, k, v, caches(48, 16, 2, 32, torch.float64), paged.plan(batch), 0.2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # a dtype the kernel does not take runs the gathered path from the same plan
    half = [x.to(torch.bfloat16) for x in (q, k, v)]
    kc, vc = (c.to(torch.bfloat16) for c in caches(48, 16, 2, 32, torch.float64))
    out = paged.forward(*half, (kc, vc), paged.plan(batch), 0.2)
    torch.testing.assert_close(out.double(), want, rtol=3e-2, atol=3e-2)


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """No compiler ($CC names a missing file) and an empty kernel cache: nothing to load or build."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv(kernel.CACHE_ENV, str(tmp_path / "kernels"))
    kernel._build.cache_clear()
    yield
    monkeypatch.undo()
    kernel._build.cache_clear()


def test_asking_for_the_kernel_without_a_compiler_is_a_clear_error(no_compiler):
    assert kernel.load() is None and "no-such-cc" in kernel.failure() and kernel.build_info() is None
    with pytest.raises(ConfigError) as err:
        make_attention_backend("cpu_kernel", "cpu")
    msg = str(err.value)  # the setting, why, and both ways out
    assert "engine.attention=cpu_kernel" in msg and "no-such-cc" in msg
    assert "engine.attention=torch" in msg and "C compiler" in msg
    with pytest.raises(kernel.KernelUnavailable):  # asked for directly: no silent gathered path either
        TorchAttentionBackend(cpu_paged_decode=True)
    with pytest.raises(kernel.KernelUnavailable, match="unavailable"):
        kernel.paged_decode(torch.zeros(1, 2, 8), *caches(4, 4, 2, 8, torch.float32),
                            torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 1.0)
    # auto never needed the compiler: the torch path, keys gathered
    backend = make_attention_backend("auto", "cpu")
    assert backend.name == "torch" and not backend.cpu_paged_decode
    batch = AttentionBatch.from_rows([BatchRow([1], 5, [2, 3])], block_size=4)
    assert backend.plan(batch).groups[0].block_ids is not None


def test_a_cell_asking_for_the_kernel_without_a_compiler_fails_before_serving(no_compiler):
    cfg = compose_cfg("engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64",
                      "engine.attention=cpu_kernel", "n_problems=1", "wandb.mode=disabled")
    with pytest.raises(ConfigError, match=r"^engine\.attention=cpu_kernel: .*engine\.attention=torch"):
        build_server(cfg)


@needs_kernel
def test_the_built_library_is_cached_per_source_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel.CACHE_ENV, str(tmp_path))
    kernel._build.cache_clear()
    try:
        assert kernel.load() is not None
        built = list(tmp_path.glob("paged_decode_*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        kernel._build.cache_clear()
        assert kernel.load() is not None and built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
        assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no build folder left behind
    finally:
        monkeypatch.undo()
        kernel._build.cache_clear()


def test_auto_on_the_cpu_is_the_torch_path_whatever_the_compiler():
    for name in ("auto", "torch"):
        backend = make_attention_backend(name, "cpu", dtype=torch.float32)
        assert not backend.cpu_paged_decode and backend.provenance() == {"path": "torch"}
    assert not TorchAttentionBackend().cpu_paged_decode


@needs_kernel
def test_cpu_kernel_asks_for_the_kernel_and_records_how_it_was_built():
    backend = make_attention_backend("cpu_kernel", "cpu", dtype=torch.float64)
    assert backend.cpu_paged_decode
    prov = backend.provenance()
    assert prov["path"] == "cpu_kernel"
    facts = prov["kernel"]
    assert set(facts) == {"compiler", "compiler_version", "flags", "source_sha256", "library"}
    assert facts["compiler_version"] and "-O3" in facts["flags"] and len(facts["source_sha256"]) == 64
    assert Path(facts["library"]).is_file() and Path(facts["library"]).parent == kernel._cache_dir()


def test_cpu_kernel_refuses_what_it_cannot_serve():
    """Never the gathered path under the kernel's name: other devices and dtypes are errors."""
    with pytest.raises(ConfigError, match="CPU only.*engine.attention=torch"):
        make_attention_backend("cpu_kernel", "cuda", dtype=torch.float32)
    with pytest.raises(ConfigError, match="float32 or float64.*engine.attention=torch"):
        make_attention_backend("cpu_kernel", "cpu", dtype=torch.bfloat16)


@needs_kernel
def test_a_cells_provenance_names_the_kernel_it_ran(tmp_path):
    summary = run_cell(compose_cfg("engine=torch", "model=tiny", "dataset=fixture_math500", "engine.dtype=float64",
                                   "engine.attention=cpu_kernel", "policy=full", "beam=4", "n_problems=1",
                                   "search.max_rounds=2", "search.step_token_cap=8", "wandb.mode=disabled",
                                   small=False), tmp_path)
    attention = summary["provenance"]["attention"]
    assert set(attention) == {"generator", "prm"}
    for role in ("generator", "prm"):
        assert attention[role] == {"path": "cpu_kernel", "kernel": kernel.build_info().as_dict()}
    assert json.loads((tmp_path / "summary.json").read_text())["provenance"]["attention"] == attention


@needs_kernel
def test_a_compiler_without_march_native_still_builds_it(tmp_path, monkeypatch):
    import shutil

    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    fake = tmp_path / "picky-cc"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && exit 1; done\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv(kernel.CACHE_ENV, str(tmp_path / "kernels"))
    kernel._build.cache_clear()
    try:
        assert kernel.load() is not None, kernel.failure()
        assert "-march=native" not in kernel.build_info().flags  # recorded as built
        rows = [BatchRow([1], 6, [1, 0])]
        q, k, v = (torch.randn(1, h, 16, dtype=torch.float64) for h in (2, 1, 1))
        batch = AttentionBatch.from_rows(rows, block_size=4)
        paged, ref = TorchAttentionBackend(cpu_paged_decode=True), TorchAttentionBackend()
        got = paged.forward(q, k, v, caches(3, 4, 1, 16, torch.float64), paged.plan(batch), 0.25)
        want = ref.forward(q, k, v, caches(3, 4, 1, 16, torch.float64), ref.plan(batch), 0.25)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    finally:
        monkeypatch.undo()
        kernel._build.cache_clear()
