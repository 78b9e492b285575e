"""Decode attention that reads the paged KV cache in place, on the CPU.

The torch backend gathers every decode row's keys and values out of the paged cache into
a dense [rows, keys] copy, then runs SDPA over it: at 256 rows x 576 keys that is 75 MB
written and read again per layer, on top of the cache read itself; this kernel (what
vLLM's CPU paged attention does) reads each row's blocks where they lie instead: per row
and KV head, the scores of every query head of its group over the row's keys (each key
read once), the softmax, then the values (each read once). Its float sums run in another
order than SDPA's, so outputs agree to round-off, not bit for bit. In float32 the softmax's
exponentials come from a polynomial the compiler vectorises (libm's ``expf`` is one call per
score: it cost a quarter of the kernel); float64 keeps libm's ``exp``.

It is C, built on first use with the system compiler (``cc``) into a shared library under
``$SPECSCALE_KERNEL_CACHE`` (default ``~/.cache/specscale/kernels``), named by a hash of the
source, the compiler and its version, the flags and this CPU (a cache shared by different
machines never hands one a library built for another), and called through ctypes with the
tensors' data pointers. It serves only where asked for (``engine.attention=cpu_kernel``):
a run's numerics must not depend on whether a compiler happens to be installed. Where no
compiler is found or the build fails, ``load()`` returns None with the reason
(``failure()``) and ``require()`` raises it; ``build_info()`` says what was built, for the
summary's provenance. Float32 and float64 only; the caller keeps other dtypes on the torch
path.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Eight lanes of a dot product or of an output row (GCC/Clang vector extensions). */
typedef float v8_f32 __attribute__((vector_size(32)));
typedef double v8_f64 __attribute__((vector_size(64)));

/* e^x for x <= 0 (a score less the row's maximum), in a loop the compiler vectorises:
   libm's expf is a call per element, which no compiler vectorises without -ffast-math.
   x = n ln2 + r with |r| <= ln2/2; e^r by its degree-7 Taylor polynomial (truncation
   error at most |r|^8/8! e^|r| / e^r, ~1e-8 relative, under float32's own rounding of
   6e-8); 2^n written into the exponent bits. x is clamped at -87
   first (e^-87 is near float's smallest normal) by comparing bit patterns: for x <= 0,
   the more negative the float, the larger its bits read as unsigned. */
static void exp_rows_f32(float *s, int n) {
    const uint32_t lim = 0xC2AE0000u; /* -87.0f */
    for (int t = 0; t < n; ++t) {
        uint32_t b;
        memcpy(&b, &s[t], 4);
        b = b > lim ? lim : b;
        float x;
        memcpy(&x, &b, 4);
        const int32_t k = (int32_t)(x * 1.44269504088896341f - 0.5f); /* round(x / ln2), x <= 0 */
        const float kf = (float)k;
        const float r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;
        float p = 1.0f / 5040.0f;
        p = p * r + 1.0f / 720.0f;
        p = p * r + 1.0f / 120.0f;
        p = p * r + 1.0f / 24.0f;
        p = p * r + 1.0f / 6.0f;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        const int32_t e = (k + 127) << 23;
        float scale;
        memcpy(&scale, &e, 4);
        s[t] = p * scale;
    }
}
static void exp_rows_f64(double *s, int n) {
    for (int t = 0; t < n; ++t) s[t] = exp(s[t]);
}

/* One (row, kv head): the g query heads of its group over the row's ctx keys. q: [g][D]
   (contiguous heads of the group), out: [g][D]; the cache is [block][slot][kv_heads][D];
   scores: scratch of g * ctx. The sums run in one fixed order: a dot product sums 8 lanes
   (lane i: elements i, i + 8, ... in order), then the lanes pairwise, then any tail (D % 8);
   an output element sums its keys' terms in key order, from 0. Four keys' dot products run
   side by side and an output row's lanes stay in registers over a block's keys (chains
   that do not wait on each other); neither changes what is summed in which order.
   DC: D / 8 when known at compile time (the loops unroll, accumulators stay in
   registers), 0 for any D. */
#define DEFINE_ROW(NAME, T, V, EXPS, DC)                                                  \
static inline V NAME##_ld(const T *p) { V v; memcpy(&v, p, sizeof v); return v; }        \
static inline T NAME##_sum(V a, const T *q, const T *k, int d, int D) {                  \
    T dot = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));          \
    for (; d < D; ++d) dot += q[d] * k[d];                                                \
    return dot;                                                                           \
}                                                                                         \
static void NAME(const T *q, T *out, const T *kc, const T *vc, const int32_t *table,       \
                 int ctx, int bs, int kvh, int j, int g, int D_, T scale, T *scores) {    \
    const int D = DC ? DC * 8 : D_;                                                       \
    const int D8 = D & ~7;                                                                \
    const int64_t ks = (int64_t)kvh * D;                                                  \
    for (int t0 = 0; t0 < ctx; t0 += bs) {                                                \
        const int n = ctx - t0 < bs ? ctx - t0 : bs;                                      \
        const T *k = kc + (int64_t)table[t0 / bs] * bs * ks + (int64_t)j * D;             \
        for (int h = 0; h < g; ++h) {                                                     \
            const T *qh = q + (int64_t)h * D;                                             \
            T *sc = scores + (int64_t)h * ctx + t0;                                       \
            int s = 0;                                                                    \
            for (; s + 4 <= n; s += 4) {                                                  \
                const T *k0 = k + s * ks, *k1 = k0 + ks, *k2 = k1 + ks, *k3 = k2 + ks;   \
                V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                 \
                for (int d = 0; d < D8; d += 8) {                                         \
                    const V qv = NAME##_ld(qh + d);                                       \
                    a0 += qv * NAME##_ld(k0 + d);                                         \
                    a1 += qv * NAME##_ld(k1 + d);                                         \
                    a2 += qv * NAME##_ld(k2 + d);                                         \
                    a3 += qv * NAME##_ld(k3 + d);                                         \
                }                                                                         \
                sc[s] = NAME##_sum(a0, qh, k0, D8, D) * scale;                            \
                sc[s + 1] = NAME##_sum(a1, qh, k1, D8, D) * scale;                        \
                sc[s + 2] = NAME##_sum(a2, qh, k2, D8, D) * scale;                        \
                sc[s + 3] = NAME##_sum(a3, qh, k3, D8, D) * scale;                        \
            }                                                                             \
            for (; s < n; ++s) {                                                          \
                const T *k0 = k + s * ks;                                                 \
                V a0 = {0};                                                               \
                for (int d = 0; d < D8; d += 8) a0 += NAME##_ld(qh + d) * NAME##_ld(k0 + d); \
                sc[s] = NAME##_sum(a0, qh, k0, D8, D) * scale;                            \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    for (int h = 0; h < g; ++h) {                                                         \
        T *sh = scores + (int64_t)h * ctx;                                                \
        T m = sh[0];                                                                      \
        for (int t = 1; t < ctx; ++t) m = sh[t] > m ? sh[t] : m;                          \
        for (int t = 0; t < ctx; ++t) sh[t] -= m;                                         \
        EXPS(sh, ctx);                                                                    \
        T sum = 0;                                                                        \
        for (int t = 0; t < ctx; ++t) sum += sh[t];                                       \
        const T inv = (T)1 / sum;                                                         \
        for (int t = 0; t < ctx; ++t) sh[t] *= inv;                                       \
    }                                                                                     \
    if (DC) {                                                                             \
        for (int h = 0; h < g; ++h) {                                                     \
            const T *sh = scores + (int64_t)h * ctx;                                      \
            V acc[DC ? DC : 1];                                                           \
            for (int c = 0; c < DC; ++c) acc[c] = (V){0};                                 \
            for (int t0 = 0; t0 < ctx; t0 += bs) {                                        \
                const int n = ctx - t0 < bs ? ctx - t0 : bs;                              \
                const T *v = vc + (int64_t)table[t0 / bs] * bs * ks + (int64_t)j * D;     \
                for (int s = 0; s < n; ++s, v += ks) {                                    \
                    const T p = sh[t0 + s];                                               \
                    for (int c = 0; c < DC; ++c) acc[c] += p * NAME##_ld(v + 8 * c);      \
                }                                                                         \
            }                                                                             \
            memcpy(out + (int64_t)h * D, acc, sizeof(T) * (size_t)D);                     \
        }                                                                                 \
        return;                                                                           \
    }                                                                                     \
    memset(out, 0, sizeof(T) * (size_t)g * D);                                            \
    for (int t0 = 0; t0 < ctx; t0 += bs) {                                                \
        const int n = ctx - t0 < bs ? ctx - t0 : bs;                                      \
        const T *v = vc + (int64_t)table[t0 / bs] * bs * ks + (int64_t)j * D;             \
        for (int s = 0; s < n; ++s, v += ks)                                              \
            for (int h = 0; h < g; ++h) {                                                 \
                const T p = scores[(int64_t)h * ctx + t0 + s];                            \
                T *oh = out + (int64_t)h * D;                                             \
                for (int d = 0; d < D; ++d) oh[d] += p * v[d];                            \
            }                                                                             \
    }                                                                                     \
}

DEFINE_ROW(row_f32, float, v8_f32, exp_rows_f32, 0)
DEFINE_ROW(row_f32_d64, float, v8_f32, exp_rows_f32, 8)
DEFINE_ROW(row_f32_d128, float, v8_f32, exp_rows_f32, 16)
DEFINE_ROW(row_f64, double, v8_f64, exp_rows_f64, 0)
DEFINE_ROW(row_f64_d64, double, v8_f64, exp_rows_f64, 8)
DEFINE_ROW(row_f64_d128, double, v8_f64, exp_rows_f64, 16)

/* q, out: [rows][heads][D]; tables: [rows][width] int32; ctx: [rows] int32.
   Returns 0, or -1 when scratch memory cannot be had. */
#define DEFINE_BATCH(NAME, T, ROW)                                                        \
int NAME(const T *q, T *out, const T *kc, const T *vc, const int32_t *tables, int width,  \
         const int32_t *ctx, int rows, int heads, int kvh, int D, int bs, double scale) { \
    const int g = heads / kvh;                                                            \
    int max_ctx = 1;                                                                      \
    for (int r = 0; r < rows; ++r) max_ctx = ctx[r] > max_ctx ? ctx[r] : max_ctx;         \
    T *scores = (T *)malloc(sizeof(T) * (size_t)g * max_ctx);                             \
    if (!scores) return -1;                                                               \
    void (*row)(const T *, T *, const T *, const T *, const int32_t *, int, int, int, int, \
                int, int, T, T *) = D == 64 ? ROW##_d64 : D == 128 ? ROW##_d128 : ROW;    \
    for (int r = 0; r < rows; ++r)                                                        \
        for (int j = 0; j < kvh; ++j) {                                                   \
            const int64_t off = ((int64_t)r * heads + (int64_t)j * g) * D;                \
            row(q + off, out + off, kc, vc, tables + (int64_t)r * width, ctx[r], bs, kvh, \
                j, g, D, (T)scale, scores);                                               \
        }                                                                                 \
    free(scores);                                                                         \
    return 0;                                                                             \
}

DEFINE_BATCH(paged_decode_f32, float, row_f32)
DEFINE_BATCH(paged_decode_f64, double, row_f64)
"""

# -O3 unrolls the 8-lane loops (vector extensions) and vectorises the exponentials; no
# -ffast-math (it would let the compiler reorder sums differently per build); no multiply-add
# contracted into an FMA (-ffp-contract=off: GCC's ISO C default, not Clang's), so every
# build sums the same way; -march=native: the library is cached per CPU (see _cpu_tag).
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", "-std=c11"]
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


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """What was built and loaded: enough to tell two runs' kernels apart (provenance)."""

    compiler: str
    compiler_version: str  # first line of ``compiler --version``
    flags: tuple[str, ...]  # the set that built it (FLAGS, or FLAGS less -march=native)
    source_sha256: str
    library: str  # the cached shared library loaded

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "flags": list(self.flags)}


class KernelUnavailable(RuntimeError):
    """The kernel was asked for but cannot be built or loaded here."""


def _find_compiler() -> tuple[str | None, str]:
    """($CC or the first of cc, gcc, clang on PATH, its version line), or (None, why not)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None, "no C compiler (cc, gcc or clang) on PATH and $CC unset"
    try:
        run = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the C compiler {compiler} cannot be run ({exc})"
    lines = (run.stdout or run.stderr).strip().splitlines()
    return compiler, lines[0] if lines else ""


def _flag_sets() -> tuple[tuple[str, ...], ...]:
    """FLAGS, then the same without -march=native (a compiler that rejects it)."""
    return tuple(FLAGS), tuple(f for f in FLAGS if f != "-march=native")


def _library_path(compiler: str, version: str, flags: tuple[str, ...]) -> Path:
    """Named by everything that makes a build differ: source, compiler (and its version:
    an upgraded compiler rebuilds instead of reusing a library another version made), flags, CPU."""
    digest = hashlib.sha256("\0".join([SOURCE, compiler, version, *flags, _cpu_tag()]).encode()).hexdigest()[:16]
    return _cache_dir() / f"paged_decode_{digest}.so"


def _compile(compiler: str, version: str) -> tuple[Path | None, tuple[str, ...], str]:
    """(library, flags) of a cached or fresh build, or (None, (), why it failed)."""
    candidates = [(flags, _library_path(compiler, version, flags)) for flags in _flag_sets()]
    for flags, lib_path in candidates:
        if lib_path.exists():
            return lib_path, flags, ""
    folder = candidates[0][1].parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = Path(tmp) / "paged_decode.c"
            src.write_text(SOURCE)
            for flags, lib_path in candidates:
                built = Path(tmp) / lib_path.name
                run = subprocess.run([compiler, *flags, str(src), "-o", str(built), "-lm"], capture_output=True,
                                     text=True)
                if run.returncode == 0:
                    os.replace(built, lib_path)  # atomic: concurrent builders (test workers) never see half a file
                    return lib_path, flags, ""
            return None, (), f"{compiler} failed: {run.stderr.strip()[-400:]}"
    except OSError as exc:
        return None, (), f"cannot build into {folder} ({exc}); set ${CACHE_ENV} to a writable folder"


@functools.lru_cache(maxsize=1)
def _build() -> tuple[ctypes.CDLL | None, KernelBuild | None, str]:
    compiler, version = _find_compiler()
    if compiler is None:
        return None, None, version
    lib_path, flags, why = _compile(compiler, version)
    if lib_path is None:
        return None, None, why
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        return None, None, f"cannot load {lib_path}: {exc}"
    for name in _DTYPES.values():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_double]
    info = KernelBuild(compiler, version, flags, hashlib.sha256(SOURCE.encode()).hexdigest(), str(lib_path))
    return lib, info, ""


def load() -> ctypes.CDLL | None:
    """The built library, or None (``failure()`` says why)."""
    return _build()[0]


def failure() -> str:
    return _build()[2]


def build_info() -> KernelBuild | None:
    """How the loaded library was built; None when it is not available."""
    return _build()[1]


def require() -> KernelBuild:
    """The build facts of the kernel, building it if needed; ``KernelUnavailable`` if it cannot be."""
    if load() is None:
        raise KernelUnavailable(f"the CPU paged decode kernel is unavailable here: {failure()}")
    return build_info()


def takes(dtype: torch.dtype) -> bool:
    """Whether the kernel computes in this dtype (float32, float64)."""
    return dtype in _DTYPES


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
        raise KernelUnavailable(f"the CPU paged decode kernel is unavailable here: {failure()}")
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
