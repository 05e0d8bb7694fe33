"""The attention-dropout keep decision, on the device (DSL) and in numpy, from one counter-based hash.

keep(seed, offset, idx) is a pure function, so backward recomputes the mask and nothing is stored.
PLACEHOLDER until helios/kernels/rng.py lands: then both functions delegate to its hash.
"""

from __future__ import annotations

import numpy as np

from helios.spirv import KernelBuilder, Value, f32, u32

_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32 (Wellons): a strong 32-bit integer mix
_GOLDEN = 0x9E3779B9


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(_M1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(_M2)
    x ^= x >> np.uint32(16)
    return x


def stream_key(seed: int, offset: int) -> int:
    """The per-call key the element hash is keyed with (host side; passed to kernels as a push constant)."""
    with np.errstate(over="ignore"):
        k = _mix_np(np.array([(offset * _GOLDEN) & 0xFFFFFFFF], dtype=np.uint32) ^ np.uint32(seed & 0xFFFFFFFF))
        return int(_mix_np(k ^ np.uint32(_GOLDEN))[0])


def keep_mask(idx: np.ndarray, p: float, seed: int, offset: int) -> np.ndarray:
    """Boolean keep decisions (probability 1 - p) for u32 element indices idx."""
    with np.errstate(over="ignore"):
        h = _mix_np(idx.astype(np.uint32) ^ np.uint32(stream_key(seed, offset)))
    u = (h >> np.uint32(8)).astype(np.float64) * 2.0 ** -24
    return u >= np.float32(p)


def keep_device(b: KernelBuilder, idx: Value, key: Value, p: Value) -> Value:
    """Boolean Value: keep element idx (u32) of the stream `key` (u32 push) at drop probability p (f32)."""
    x = idx ^ key
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 15)
    x = x * _M2
    x = x ^ (x >> 16)
    u = b.cast(x >> 8, f32) * (2.0 ** -24)
    return u >= p


__all__ = ["keep_mask", "keep_device", "stream_key", "u32"]
