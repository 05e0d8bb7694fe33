"""Dropout, with masks recomputed from the counter-based RNG (kernels/lib/rng.py).

Element i is kept when uniform(seed, offset, i) >= p and then scaled by 1 / (1 - p). The mask is a pure
function of (seed, offset, i), so backward recomputes it from the same three numbers and nothing is stored.
The element index is the flat index within the tensor, identical in the "scalar" and "vec4" variants.
p = 0 needs no random numbers (dropout becomes a copy); p = 1 drops everything. residual_dropout_add
(fused.py) reuses `dropped`. dropout is an op spec (helios.kernels.contract.spec; p, seed and offset are its scalars):
its numpy reference draws the device's mask bit for bit (rng.keep_mask_reference), so the derived tests compare
values, masks included, to within the one rounding of the scaled result.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract.dtypes import check_float
from helios.kernels.contract.spec import OpSpec, normal_inputs, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import map_kernel, output, run_map
from helios.kernels.lib.rng import counter_or_zero, keep_mask_reference, seed_words, uniform
from helios.kernels.pointwise.elementwise import clone
from helios.runtime import Tensor, zeros
from helios.spirv import f32, u32

RNG_PARAMS = [("p", f32), ("scale", f32), ("seed", u32), ("offset", u32)]


def dropped(b, y, index, p, scale, seed, offset):
    """DSL: y * scale where uniform(seed, offset, index) >= p, else 0 (scalar or vec4)."""
    keep = uniform(b, seed, offset, index) >= p
    return b.select(keep, y * scale, 0.0)


DROPOUT = map_kernel("dropout", lambda b, x, index, **k: dropped(b, x, index, **k), params=RNG_PARAMS, flops=20,
                     counter="offset")


def check_p(p: float) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return p


def rng_push(p: float, seed: int, offset: int) -> dict:
    s, o = seed_words(seed, offset)
    return {"p": p, "scale": 1.0 / (1.0 - p), "seed": s, "offset": o}


def dropout(x: Tensor, p: float, seed: int, offset: int, counter: Tensor | None = None) -> Tensor:
    """x * keep / (1 - p), keep = uniform(seed, offset + counter[0], i) >= p; a new tensor. `counter`: a
    one-word u32 tensor (a captured step's RNG counter); None adds 0."""
    check_float(x)
    p = check_p(p)
    if p == 0.0:
        return clone(x)
    if p == 1.0:
        return zeros(x.shape, x.dtype)
    y = output(x, None)
    run_map(DROPOUT, [x, y, counter_or_zero(counter)], x.numel, **rng_push(p, seed, offset))
    return y


def dropout_backward(dy: Tensor, p: float, seed: int, offset: int, counter: Tensor | None = None) -> Tensor:
    """dx = dy * keep / (1 - p) with the forward's mask, recomputed (the same counter, unchanged since)."""
    return dropout(dy, p, seed, offset, counter)


def reference_dropout(x: np.ndarray, p: float, seed: int, offset: int) -> np.ndarray:
    """numpy twin: the same mask as the kernels (bit-exact), scaled in x's dtype by the kernels' f32 scale."""
    if p == 0.0:
        return x.copy()
    if p == 1.0:
        return np.zeros_like(x)
    keep = keep_mask_reference(seed, offset, x.size, p).reshape(x.shape)
    return np.where(keep, x * x.dtype.type(np.float32(1.0 / (1.0 - p))), x.dtype.type(0.0))


def reference_dropout_backward(dy: np.ndarray, p: float, seed: int, offset: int) -> np.ndarray:
    """dx: dy through the forward's mask and scale."""
    return reference_dropout(dy, p, seed, offset)


# -- op spec: tests, autograd, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) -----------------
# The k-th shape runs the k-th (p, seed, offset): p = 0 (a copy) and p = 1 (zeros) on two extra shapes, so every
# awkward shape draws a mask; 64-bit seeds and offsets past 2**32 exercise seed_words' folding.
DROPOUT_SHAPES = ((1,), (7,), (2, 3), (33, 513), (5,), (1, 4097), (33, 12), (4096,), (513, 7), (33, 64), (9, 32))
DROPOUT_SCALARS = {"p": (0.25, 0.9, 0.0, 0.1, 1.0, 0.75, 0.3, 0.5, 0.2, 0.6, 0.4),
                   "seed": (99, 2**40 + 3, 0, 7, 1234, 5, 11, 2**63 - 1, 42, 1, 2**32),
                   "offset": (3, 2**33 + 1, 0, 1, 17, 2**31, 8, 9, 2**32 - 1, 100, 5)}
# The mask is exact; each kept value is x times the f32 scale, rounded to f32 (1 rounding) and then to the dtype.
register(OpSpec("dropout", "x * keep / (1 - p), keep = uniform(seed, offset, i) >= p (counter-based RNG, recomputed "
                "in backward).", __name__, (DROPOUT, DROPOUT), dropout, dropout_backward, reference_dropout,
                reference_dropout_backward, lambda rng, shape, **_: (normal_inputs(rng, shape),), saves=(),
                shapes=DROPOUT_SHAPES, scalars=DROPOUT_SCALARS,
                tolerance={"y": Tolerance(rel=1), "dx": Tolerance(rel=1)}))
