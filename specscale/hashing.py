"""Counter-based hashing for lineage keys and paired uniforms (docs/design.md §4).

SplitMix64's finaliser is a bijective 64-bit mixer with good avalanche; combining it
with a counter gives a stateless generator: the uniform for (key, t) depends on
nothing but those two numbers, so it is the same whatever batch, timing or physical
grouping produced the token. Scalar helpers use Python ints (exact, no overflow
warnings); vector helpers use numpy uint64, whose arithmetic wraps modulo 2**64.
"""
from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_INV_2_53 = 1.0 / float(1 << 53)


def mix64(x: int) -> int:
    """SplitMix64 finaliser of one 64-bit integer."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def combine(a: int, b: int) -> int:
    """Hash of the ordered pair (a, b); the building block of every key."""
    return mix64((a & MASK64) ^ mix64(b & MASK64))


_ROLL = 0xD6E8FEB86659FD93


def roll(h: int, token: int) -> int:
    """Extend a rolling history hash by one token (one mix per token: it runs per draw)."""
    return mix64(h ^ (((token + 1) * _ROLL) & MASK64))


def roll_np(h: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Vectorised :func:`roll`: each hash extended by its token (uint64 arithmetic wraps
    modulo 2**64, so this is bit-identical to the scalar form)."""
    t = (np.asarray(tokens, dtype=np.int64) + 1).astype(np.uint64)
    return _mix64_np(np.asarray(h, dtype=np.uint64) ^ (t * np.uint64(_ROLL)))


def root_key(seed: int, request_id: int) -> int:
    """Lineage key of a request's root: hash(seed, request_id)."""
    return combine(mix64(seed & MASK64), request_id)


def child_key(parent_key: int, child_index: int) -> int:
    """Lineage key of child j of a candidate: hash(key(parent), j)."""
    return combine(parent_key, child_index)


def to_unit(h: int) -> float:
    """Map a 64-bit hash to a float in [0, 1) using its top 53 bits."""
    return (h >> 11) * _INV_2_53


def _mix64_np(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def combine_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Vectorised :func:`combine` over uint64 arrays (broadcasting; array arithmetic wraps silently)."""
    return _mix64_np(np.atleast_1d(np.asarray(a, dtype=np.uint64)) ^ _mix64_np(np.atleast_1d(np.asarray(b, dtype=np.uint64))))


def unit_np(h: np.ndarray) -> np.ndarray:
    """Vectorised :func:`to_unit`."""
    return (h >> np.uint64(11)).astype(np.float64) * _INV_2_53


def paired_uniforms(keys: np.ndarray, token_index: np.ndarray) -> np.ndarray:
    """u = U(hash(key, t)) for every (lineage key, token index within the step)."""
    return unit_np(combine_np(keys, token_index))
