"""ops.cast and ops.scale_by beyond their op specs (whose derived tests, tests/kernels/test_opspecs.py, run every
source and target dtype in every forced access, and spirv-val of every variant): cast bit-exact against numpy's
round to nearest even with NaN, Inf, overflow, -0.0 and a tie, round trips through f32 and the other half dtype,
numpy dtypes as targets; scale_by bit-exact with a factor no half dtype holds (never rounded to x's dtype); clear
errors for bad arguments. All sizes inside each test, so each variant compiles once."""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract.dtypes import NUMPY
from helios.kernels.pointwise.cast import reference_cast
from tests.conftest import dtype_params

SIZES = (1, 7, 33, 513, 4096, 4097)


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, what
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan, err_msg=what)
    np.testing.assert_array_equal(got[~nan].astype(np.float32), want[~nan].astype(np.float32), err_msg=what)


@pytest.mark.parametrize("dtype", dtype_params("bf16", "fp16"))
def test_cast_round_trips_bit_exactly(dtype, access):
    other = "fp16" if dtype == "bf16" else "bf16"
    for n in SIZES:
        rng = np.random.default_rng(n)
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
        x[: min(n, 6)] = np.array([np.nan, np.inf, -np.inf, 7e4, -0.0, 1.00048828125], np.float32)[: min(n, 6)]
        with np.errstate(over="ignore"):
            half = ops.cast(rt.from_numpy(x), dtype).numpy()
            _same(half, reference_cast(x, dtype), f"f32 -> {dtype}, n={n}")
        back = ops.cast(rt.from_numpy(half), "f32").numpy()
        _same(back, half.astype(np.float32), f"{dtype} -> f32, n={n}")
        with np.errstate(over="ignore"):
            _same(ops.cast(rt.from_numpy(half), other).numpy(), reference_cast(half, other), f"{dtype} -> {other}")
        same = ops.cast(rt.from_numpy(half), np.dtype(NUMPY[dtype])).numpy()  # same dtype: a copy
        _same(same, half, f"{dtype} -> {dtype}, n={n}")


@pytest.mark.parametrize("dtype", dtype_params("bf16", "fp16"))
def test_scale_by_keeps_the_scalar_in_fp32(dtype):
    s = np.array([1.0 / 3.0], np.float32)  # not a half value: rounding it would show
    for n in SIZES:
        x = (np.random.default_rng(n + 1).standard_normal(n) * 1e-3).astype(NUMPY[dtype])
        got = ops.scale_by(rt.from_numpy(x), rt.from_numpy(s)).numpy()
        _same(got, (x.astype(np.float32) * s[0]).astype(NUMPY[dtype]), f"scale_by {dtype}, n={n}")


def test_bad_arguments_are_clear_errors():
    x = rt.from_numpy(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="dtype must be one of"):
        ops.cast(x, "int8")
    with pytest.raises(TypeError, match="float32 tensor of one element"):
        ops.scale_by(x, rt.from_numpy(np.ones(2, np.float32)))
    with pytest.raises(TypeError, match="expected a float32, bfloat16 or float16"):
        ops.cast(rt.from_numpy(np.ones(4, np.int32)), "bf16")
