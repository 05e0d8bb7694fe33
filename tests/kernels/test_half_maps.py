"""bfloat16 and float16 elementwise maps outside the op specs (whose derived tests, tests/kernels/test_opspecs.py,
run every activation, swiglu, dropout and residual_dropout_add in every dtype): arithmetic, broadcasts and
masked_fill's "bf16_*" and "fp16_*" variants (16-bit storage, f32 math, one rounding per output) against the fp32
numpy reference at awkward sizes, with every access form (scalar, vec4 + scalar tail, 64-bit packed words) and the
row/column broadcasts. Ops whose f32 result is exact before the rounding (add, mul, scale, masked_fill) must match
bit for bit; division within one half rounding. Each test runs for both half dtypes (the `half` fixture).
Mixing half and fp32 operands is an error that says what to do. spirv-val of every variant is in the
families' own tests (their variant lists include the half ones)."""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.dtypes import NUMPY, ROUNDING

SIZES = (1, 7, 33, 513, 4096, 4097)
HALF = {"dtype": "bf16"}  # the half dtype of the running test (set by the `half` fixture)


@pytest.fixture(autouse=True, params=["bf16", "fp16"])
def half(request):
    HALF["dtype"] = request.param
    return request.param


@pytest.fixture(params=["scalar", "vec4", "u64x2"])
def bf16_access(request, force):
    force("elementwise", request.param)
    return request.param


def _np() -> np.dtype:
    return NUMPY[HALF["dtype"]]


def _bf16(rng, shape, scale=3.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(_np())


def _rounded(x: np.ndarray) -> np.ndarray:
    """An f32/f64 result rounded to the half dtype and widened back: what a bit-exact kernel stores."""
    return np.asarray(x, np.float32).astype(_np()).astype(np.float32)


def _exact(got, want) -> None:
    assert got.dtype == _np()
    np.testing.assert_array_equal(got.astype(np.float32), _rounded(want))


def _close(got, want, atol=1e-6) -> None:
    assert got.dtype == _np()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2 * ROUNDING[HALF["dtype"]], atol=atol)


@pytest.mark.parametrize("n", SIZES)
def test_arithmetic_is_bit_exact(n, bf16_access):
    rng = np.random.default_rng(n)
    a, b = _bf16(rng, n), _bf16(rng, n)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ta, tb = rt.from_numpy(a), rt.from_numpy(b)
    _exact(ops.add(ta, tb).numpy(), a32 + b32)
    _exact(ops.sub(ta, tb).numpy(), a32 - b32)
    _exact(ops.mul(ta, tb).numpy(), a32 * b32)
    _close(ops.div(ta, tb).numpy(), a32 / b32)  # OpFDiv may be 2.5 ulp of f32 on some drivers
    _exact(ops.scale(ta, 0.37).numpy(), a32 * np.float32(0.37))
    _exact(ops.neg(ta).numpy(), -a32)
    ops.add_inplace(ta, tb, 0.5)
    _exact(ta.numpy(), a32 + b32 * np.float32(0.5))


@pytest.mark.parametrize("rows,cols", [(1, 4), (7, 33), (33, 12), (3, 516)])
def test_broadcasts(rows, cols, bf16_access):
    rng = np.random.default_rng(rows * cols)
    a, row, col = _bf16(rng, (rows, cols)), _bf16(rng, (cols,)), _bf16(rng, (rows, 1))
    a32 = a.astype(np.float32)
    _exact(ops.add(rt.from_numpy(a), rt.from_numpy(row)).numpy(), a32 + row.astype(np.float32))
    _exact(ops.mul(rt.from_numpy(a), rt.from_numpy(col)).numpy(), a32 * col.astype(np.float32))


@pytest.mark.parametrize("n", SIZES)
def test_masked_fill(n, bf16_access):
    rng = np.random.default_rng(n + 7)
    x = _bf16(rng, n)
    x64 = x.astype(np.float64)
    mask = (rng.random(n) < 0.5).astype(np.int32)
    _exact(ops.masked_fill(rt.from_numpy(x), rt.from_numpy(mask), -2.0).numpy(), np.where(mask, -2.0, x64))


def test_mixing_dtypes_is_a_clear_error(half):
    a = rt.from_numpy(np.ones(8, _np()))
    b = rt.from_numpy(np.ones(8, np.float32))
    with pytest.raises(TypeError, match=f"mix {half} and f32" if half == "bf16" else "mix f32 and fp16"):
        ops.add(a, b)
    with pytest.raises(ValueError, match="bfloat16|float16"):
        ops.add(a, a, out=rt.empty((8,)))
