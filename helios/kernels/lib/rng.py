"""Counter-based random numbers for kernels: a stateless hash of (seed, offset, index[, stream]).

Nothing is stored between calls: a random op passes `seed` and a per-call `offset` in push constants, and
every element draws `uniform(seed, offset, index)` from its own index. Backward recomputes the same values
from the same three numbers, so dropout masks are never stored.

The hash is pcg4d (Jarzynski & Olano, "Hash Functions for GPU Rendering", JCGT 2020): two rounds of
multiply-add mixing across four 32-bit lanes, only 32-bit integer multiplies and shifts, so it costs
the same on every Vulkan device. The low bits of its outputs are slightly biased, so `uniform` uses the
top 24 bits of lane w; a float in [0, 1) needs no more.

Use from another kernel (e.g. attention dropout):

    from helios.kernels.lib.rng import uniform, seed_words
    seed = b.push("seed", u32); offset = b.push("offset", u32)    # host: seed_words(seed, offset)
    u = uniform(b, seed, offset, index, stream)   # f32 (or vec4<f32> when index is vec4<u32>) in [0, 1)
    keep = u >= p                                 # keep with probability 1 - p

The kernels that draw for dropout (dropout, residual_dropout_add, flash attention) add to `offset` element 0
of a one-word u32 "counter" buffer they also bind. Lazily recorded steps bind `zero_counter()` and pass the
whole offset as a push constant; a captured step (runtime/capture.py) binds its own counter and writes each
pass's base into it before a replay, so the masks change per step while the commands stay the same.

`index` and `stream` are u32 Values (scalars or vec4<u32>; scalars are splatted). Two draws are independent
unless all of (seed, offset, index, stream) agree. Attention can pass the key position as `index` and
`(batch * heads + head) * T + query` as `stream` so no 32-bit product overflows. `uniform_reference` is
the bit-exact numpy twin for tests and references; `rand` fills a tensor with the same numbers.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.lib.maps import map_kernel, run_map
from helios.runtime import Tensor, empty
from helios.spirv import KernelBuilder, Value, f32, u32

_MUL, _ADD = 1664525, 1013904223  # the LCG step that opens pcg4d (Numerical Recipes constants)
_INV_2_24 = 1.0 / (1 << 24)


_ZERO_COUNTERS: dict[tuple, tuple[object, Tensor]] = {}


def zero_counter() -> Tensor:
    """A shared one-word u32 counter holding 0 (per runtime): what a dropout kernel binds when the offset
    push constant already holds the whole offset."""
    from helios.runtime import per_runtime, zeros

    return per_runtime(_ZERO_COUNTERS, None, lambda: zeros((1,), np.uint32))


def counter_or_zero(counter: Tensor | None) -> Tensor:
    """`counter` checked (a u32 tensor of at least one element), or the shared zero counter."""
    if counter is None:
        return zero_counter()
    if counter.dtype != np.uint32 or counter.numel < 1:
        raise ValueError(f"an RNG counter is a uint32 tensor of one element, got {counter.dtype} {counter.shape}")
    return counter


def seed_words(seed: int, offset: int) -> tuple[int, int]:
    """Host side: fold a Python int seed (any size) and offset into the two u32 push constants."""
    s = int(seed)
    folded = 0
    while True:  # xor-fold 64-bit (or larger) seeds so no bits are ignored
        folded ^= s & 0xFFFFFFFF
        s >>= 32
        if s <= 0:
            break
    return folded, int(offset) & 0xFFFFFFFF


def _pcg4d_rounds(x, y, z, w, shr):
    """pcg4d's mixing on any integers with wrapping 32-bit arithmetic; `shr(v)` is v >> 16."""
    x = x * _MUL + _ADD
    y = y * _MUL + _ADD
    z = z * _MUL + _ADD
    w = w * _MUL + _ADD
    for last in (False, True):
        x = x + y * w
        y = y + z * x
        z = z + x * y
        w = w + y * z
        if not last:
            x, y, z, w = x ^ shr(x), y ^ shr(y), z ^ shr(z), w ^ shr(w)
    return w


def hash_u32(b: KernelBuilder, seed: Value, offset: Value, index: Value, stream=0) -> Value:
    """32 random bits (u32, or vec4<u32> for a vec4 index) from (seed, offset, index, stream)."""
    stream = b.const(stream, u32) if isinstance(stream, int) else stream
    n = max(index.type.count, stream.type.count)
    index, stream = b.splat(index, n), b.splat(stream, n)
    # seed and offset stay scalar where possible: mixing them is uniform work, done once per invocation.
    return _pcg4d_rounds(index, stream, offset, seed, lambda v: v >> 16)


def uniform(b: KernelBuilder, seed: Value, offset: Value, index: Value, stream=0) -> Value:
    """A uniform float in [0, 1) (f32, or vec4<f32> for a vec4 index); multiples of 2**-24."""
    h = hash_u32(b, seed, offset, index, stream) >> 8
    return b.cast(h, f32) * _INV_2_24


def uniform_reference(seed: int, offset: int, index, stream=0) -> np.ndarray:
    """numpy twin of `uniform` (bit-exact): float32 array shaped like `index`."""
    s, o = seed_words(seed, offset)
    idx = np.asarray(index, dtype=np.uint32)
    u = np.uint32
    with np.errstate(over="ignore"):
        w = _pcg4d_rounds(idx, np.full_like(idx, u(int(stream) & 0xFFFFFFFF)), np.full_like(idx, u(o)),
                          np.full_like(idx, u(s)), lambda v: v >> u(16))
    return (w >> u(8)).astype(np.float32) * np.float32(_INV_2_24)


def keep_mask_reference(seed: int, offset: int, n: int, p: float) -> np.ndarray:
    """numpy twin of the dropout keep decision over elements 0..n-1: uniform >= p (as float32)."""
    return uniform_reference(seed, offset, np.arange(n, dtype=np.uint32)) >= np.float32(p)


def _rand_body(b: KernelBuilder, index: Value, seed: Value, offset: Value, stream: Value) -> Value:
    return uniform(b, seed, offset, index, stream)


RAND = map_kernel("rand", _rand_body, n_in=0, params=[("seed", u32), ("offset", u32), ("stream", u32)], flops=20)


def rand(shape, seed: int, offset: int, stream: int = 0) -> Tensor:
    """A float32 tensor of uniform(seed, offset, i, stream) for flat indices i: the numbers dropout draws."""
    y = empty(shape)
    s, o = seed_words(seed, offset)
    run_map(RAND, [y], y.numel, seed=s, offset=o, stream=int(stream) & 0xFFFFFFFF)
    return y
