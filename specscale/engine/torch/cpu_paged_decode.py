"""Decode attention that reads the paged KV cache in place, on the CPU.

The torch backend gathers every decode row's keys and values out of the paged cache into
a dense [rows, keys] copy, then runs SDPA over it: at 256 rows x 576 keys that is 75 MB
written and read again per layer, on top of the cache read itself; this kernel (what
vLLM's CPU paged attention does) reads each row's blocks where they lie instead: per row
and KV head, the scores of every query head of its group over the row's keys (each key
read once), the softmax, then the values (each read once). Its float sums run in another
order than SDPA's, so outputs agree to round-off, not bit for bit.

It is C, built on first use with the system compiler (``cc``) into a shared library under
``$SPECSCALE_KERNEL_CACHE`` (default ``~/.cache/specscale/kernels``), named by a hash of the
source, the flags and this CPU (a cache shared by different machines never hands one a
library built for another), and called through ctypes with the tensors' data pointers.
Where no compiler is found or the build fails, ``load()`` returns None with the reason
(``failure()``) and the torch path serves (``engine.attention=torch`` forces it). Float32
and float64 only; the caller keeps other dtypes on the torch path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One (row, kv head): the g query heads of its group over the row's ctx keys, block by
   block (each key and value read once, for all g heads). q: [g][D] (contiguous heads of
   the group), out: [g][D]; the cache is [block][slot][kv_heads][D]; scores: scratch of
   g * ctx. */
#define DEFINE_ROW(NAME, T)                                                               \
static void NAME(const T *q, T *out, const T *kc, const T *vc, const int32_t *table,       \
                 int ctx, int bs, int kvh, int j, int g, int D, T scale, T *scores) {     \
    const int64_t key_stride = (int64_t)kvh * D;                                                \
    for (int t0 = 0; t0 < ctx; t0 += bs) {                                                \
        const int n = ctx - t0 < bs ? ctx - t0 : bs;                                      \
        const T *k = kc + (int64_t)table[t0 / bs] * bs * key_stride + (int64_t)j * D;           \
        for (int s = 0; s < n; ++s, k += key_stride)                                      \
            for (int h = 0; h < g; ++h) {                                                 \
                const T *qh = q + (int64_t)h * D;                                            \
                T lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                     \
                int d = 0;                                                                \
                for (; d + 8 <= D; d += 8)                                                \
                    for (int i = 0; i < 8; ++i) lane[i] += qh[d + i] * k[d + i];          \
                T dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +                     \
                        ((lane[4] + lane[5]) + (lane[6] + lane[7]));                      \
                for (; d < D; ++d) dot += qh[d] * k[d];                                   \
                scores[(int64_t)h * ctx + t0 + s] = dot * scale;                             \
            }                                                                             \
    }                                                                                     \
    for (int h = 0; h < g; ++h) {                                                         \
        T *sh = scores + (int64_t)h * ctx;                                                   \
        T m = sh[0];                                                                      \
        for (int t = 1; t < ctx; ++t) m = sh[t] > m ? sh[t] : m;                          \
        T sum = 0;                                                                        \
        for (int t = 0; t < ctx; ++t) { sh[t] = EXP_##T(sh[t] - m); sum += sh[t]; }       \
        const T inv = (T)1 / sum;                                                         \
        for (int t = 0; t < ctx; ++t) sh[t] *= inv;                                       \
    }                                                                                     \
    memset(out, 0, sizeof(T) * (size_t)g * D);                                            \
    for (int t0 = 0; t0 < ctx; t0 += bs) {                                                \
        const int n = ctx - t0 < bs ? ctx - t0 : bs;                                      \
        const T *v = vc + (int64_t)table[t0 / bs] * bs * key_stride + (int64_t)j * D;           \
        for (int s = 0; s < n; ++s, v += key_stride)                                      \
            for (int h = 0; h < g; ++h) {                                                 \
                const T p = scores[(int64_t)h * ctx + t0 + s];                               \
                T *oh = out + (int64_t)h * D;                                                \
                for (int d = 0; d < D; ++d) oh[d] += p * v[d];                            \
            }                                                                             \
    }                                                                                     \
}

#define EXP_float expf
#define EXP_double exp
DEFINE_ROW(row_f32, float)
DEFINE_ROW(row_f64, double)

/* q, out: [rows][heads][D]; tables: [rows][width] int32; ctx: [rows] int32.
   Returns 0, or -1 when scratch memory cannot be had. */
#define DEFINE_BATCH(NAME, ROW, T)                                                        \
int NAME(const T *q, T *out, const T *kc, const T *vc, const int32_t *tables, int width,  \
         const int32_t *ctx, int rows, int heads, int kvh, int D, int bs, double scale) { \
    const int g = heads / kvh;                                                            \
    int max_ctx = 1;                                                                      \
    for (int r = 0; r < rows; ++r) max_ctx = ctx[r] > max_ctx ? ctx[r] : max_ctx;         \
    T *scores = (T *)malloc(sizeof(T) * (size_t)g * max_ctx);                              \
    if (!scores) return -1;                                                               \
    for (int r = 0; r < rows; ++r)                                                        \
        for (int j = 0; j < kvh; ++j) {                                                   \
            const int64_t off = ((int64_t)r * heads + (int64_t)j * g) * D;                         \
            ROW(q + off, out + off, kc, vc, tables + (int64_t)r * width, ctx[r], bs, kvh, j,   \
                g, D, (T)scale, scores);                                                  \
        }                                                                                 \
    free(scores);                                                                         \
    return 0;                                                                             \
}

DEFINE_BATCH(paged_decode_f32, row_f32, float)
DEFINE_BATCH(paged_decode_f64, row_f64, double)
"""

# -O3 vectorises the 8-lane dot products and the value sums; no -ffast-math (it would let
# the compiler reorder sums differently per build); -march=native: the library is cached
# per CPU (see _cpu_tag).
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c11"]
CACHE_ENV = "SPECSCALE_KERNEL_CACHE"
_DTYPES = {torch.float32: "paged_decode_f32", torch.float64: "paged_decode_f64"}


def _cpu_tag() -> str:
    """What makes a -march=native build specific: the machine and its CPU's model and flags."""
    info = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    info += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{platform.system()}|{info}"


def _cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specscale" / "kernels")


@functools.lru_cache(maxsize=1)
def _build() -> tuple[ctypes.CDLL | None, str]:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    digest = hashlib.sha256("\0".join([SOURCE, compiler, *FLAGS, _cpu_tag()]).encode()).hexdigest()[:16]
    lib_path = _cache_dir() / f"paged_decode_{digest}.so"
    if not lib_path.exists():
        try:
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib_path.parent) as tmp:
                src = Path(tmp) / "paged_decode.c"
                src.write_text(SOURCE)
                built = Path(tmp) / lib_path.name
                for flags in (FLAGS, [f for f in FLAGS if f != "-march=native"]):  # (a compiler without it)
                    run = subprocess.run([compiler, *flags, str(src), "-o", str(built), "-lm"], capture_output=True,
                                         text=True)
                    if run.returncode == 0:
                        break
                else:
                    return None, f"{compiler} failed: {run.stderr.strip()[-400:]}"
                os.replace(built, lib_path)  # atomic: concurrent builders (test workers) never see half a file
        except OSError as exc:
            return None, f"cannot build into {lib_path.parent} ({exc}); set ${CACHE_ENV} to a writable folder"
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        return None, f"cannot load {lib_path}: {exc}"
    for name in _DTYPES.values():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_double]
    return lib, ""


def load() -> ctypes.CDLL | None:
    """The built library, or None (``failure()`` says why)."""
    return _build()[0]


def failure() -> str:
    return _build()[1]


@functools.lru_cache(maxsize=1)
def log_failure_once() -> None:
    logger.warning("CPU paged decode kernel unavailable (%s); decode rows gather their keys (torch path)",
                   failure())


def usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """The kernel serves these tensors: CPU, float32/64, contiguous caches, and it built."""
    return (q.device.type == "cpu" and q.dtype in _DTYPES and k_cache.dtype == q.dtype == v_cache.dtype
            and k_cache.is_contiguous() and v_cache.is_contiguous() and load() is not None)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                 context: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one query per row over the row's first ``context[r]`` cached keys.

    q: [rows, heads, D] (heads h = j * group + i read KV head j); k/v_cache: [blocks,
    block_size, kv_heads, D], contiguous; tables: [rows, width] int32, row r's blocks in
    order (entries past its context are never read); context: [rows] int32, each >= 1.
    Returns [rows, heads, D] in q's dtype."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"the CPU paged decode kernel is unavailable: {failure()}")
    rows, heads, dim = q.shape
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if heads % kv_heads or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_decode needs heads divisible by kv_heads and contiguous caches")
    if tables.dtype != torch.int32 or context.dtype != torch.int32:
        raise ValueError("paged_decode takes int32 block tables and context lengths")
    q = q.contiguous()
    tables, context = tables.contiguous(), context.contiguous()
    out = torch.empty_like(q)
    fn = getattr(lib, _DTYPES[q.dtype])
    rc = fn(q.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            tables.shape[1], context.data_ptr(), rows, heads, kv_heads, dim, block_size, float(scale))
    if rc != 0:
        raise MemoryError("paged_decode: no memory for the scores scratch")
    return out
