"""Dtype conversion between float32 and the half dtypes, and scaling a tensor of any float dtype by an fp32
device scalar (a loss scale or a chunk weight) without rounding the scalar to the tensor's dtype.

Both are elementwise maps (elementwise.py) whose fp32 side is read or written as raw 32-bit words, so the
variant's dtype governs only the half side: `cast_to_half` reads u32 words (bitcast to f32) and stores
half; `cast_to_f32` reads half and stores the f32's bits; `scale_by` reads its scalar as a u32 word
broadcast to every element (a "col" broadcast whose one column spans the whole tensor).
Their access (scalar, vec4, u64x2) is the "elementwise" selection family's choice, made in run_map: force
it there (helios.kernels.contract.selection). Which kernel runs follows from the dtypes, which is no choice.
Both are forward-only op specs (helios.kernels.contract.spec; cast's target dtype is a scalar that names the output's
dtype): their tests, bench entries and docs/OPS.md rows derive from the `register(OpSpec(...))` calls at the bottom.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract.dtypes import FLOAT_DTYPES, HALF_DTYPES, NUMPY, check_float
from helios.kernels.contract.spec import OpSpec, OutputDtypes, normal_inputs, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.maps import map_kernel, run_map
from helios.runtime import Tensor, copy, empty
from helios.spirv import f32, u32

CAST_TO_HALF = map_kernel("cast_to_half", lambda b, x, index: b.bitcast(x, f32), inputs=(u32,))
CAST_TO_F32 = map_kernel("cast_to_f32", lambda b, x, index: b.bitcast(x, u32), outputs=(u32,))
SCALE_BY = map_kernel("scale_by", lambda b, x, s, index: x * b.bitcast(s, f32), inputs=(f32, u32), broadcast=True)


def reference_cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """numpy's conversion (round to nearest even): what the kernels store."""
    return np.asarray(x).astype(np.float32).astype(NUMPY[dtype])


def cast(x: Tensor, dtype: str, out: Tensor | None = None) -> Tensor:
    """x converted to dtype ("f32", "bf16" or "fp16"; numpy dtypes are accepted too), rounded to nearest
    even; a tensor already of that dtype is copied (a new tensor either way, unless `out` is given)."""
    name = FLOAT_DTYPES.get(np.dtype(dtype), None) if not isinstance(dtype, str) else dtype
    if name not in NUMPY:
        raise ValueError(f"cast: dtype must be one of {', '.join(NUMPY)}, got {dtype!r}")
    src = check_float(x)
    if out is None:
        out = empty(x.shape, NUMPY[name])
    elif out.dtype != NUMPY[name] or out.numel != x.numel:
        raise ValueError(f"cast: out must be {NUMPY[name]} with {x.numel} elements, got {out.dtype} {out.shape}")
    n = int(x.numel)
    if src == name:
        copy(x, out)
    elif src == "f32" and name != "f32":
        run_map(CAST_TO_HALF, [x, out], n, float_operands=[out])
    elif name == "f32":
        run_map(CAST_TO_F32, [x, out], n, float_operands=[x])
    else:  # one half dtype to the other: through f32 (two roundings would differ from one: never wanted)
        run_map(CAST_TO_HALF, [cast(x, "f32"), out], n, float_operands=[out])
    return out


def scale_by(x: Tensor, s: Tensor, out: Tensor | None = None) -> Tensor:
    """x * s[0] for x of any float dtype and s a (1,) float32 device tensor; f32 math, one rounding."""
    check_float(x)
    if s.dtype != np.float32 or s.numel != 1:
        raise TypeError(f"scale_by: the scalar must be a float32 tensor of one element, got {s.dtype} {s.shape}")
    if out is None:
        out = empty(x.shape, x.dtype)
    n = int(x.numel)
    run_map(SCALE_BY, [x, s, out], n, bcast="col", cols=n, float_operands=[x, out])
    return out


def reference_scale_by(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    return x * s[0]


__all__ = ["cast", "scale_by", "reference_cast", "reference_scale_by"]


# -- op specs (forward-only; tests, bench and docs/OPS.md derive from them) --------------------------------------
# cast: the reference rounds too, so only the one correctly rounded result passes (the bound is one rounding of the
# target dtype). The round trips, NaN, Inf and overflow are tests/kernels/pointwise/test_cast.py's.
register(OpSpec("cast", "x converted to dtype (f32, bf16 or fp16), rounded to nearest even; the same dtype copies.",
                __name__, (CAST_TO_HALF, CAST_TO_F32), cast, None, reference_cast, None,
                lambda rng, shape, **_: (normal_inputs(rng, shape),), saves=(),
                scalars={"dtype": OutputDtypes(HALF_DTYPES + ("f32",))},
                tolerance={"y": Tolerance()}, autograd=False))


def _scale_by_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, np.ndarray]:
    # a factor no half dtype holds exactly, so rounding it to x's dtype would show (test_cast checks bit-exactly)
    return normal_inputs(rng, shape), np.array([rng.uniform(0.1, 3.0)], np.float32)


# x * s in f32 (one rounding), then the dtype's.
register(OpSpec("scale_by", "x * s[0] for x of any float dtype and s a (1,) float32 device tensor (never rounded to "
                "x's dtype).", __name__, (SCALE_BY,), scale_by, None, reference_scale_by, None, _scale_by_inputs,
                args=("x", "s"), f32=("s",), saves=(), tolerance={"y": Tolerance(rel=1)}, autograd=False))
