"""ops.cast between float32, bfloat16 and float16 (bit-exact against numpy's round to nearest even, every
access form, awkward sizes, NaN/Inf/overflow), and ops.scale_by (a half tensor times an fp32 device scalar
that is never rounded to the half dtype); spirv-val of every variant."""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.cast import CAST_TO_F32, CAST_TO_HALF, SCALE_BY, reference_cast
from helios.kernels.dtypes import NUMPY
from tests.spirv_val import spirv_cases

SIZES = (1, 7, 33, 513, 4096, 4097)


@pytest.fixture(params=["scalar", "vec4", "u64x2"])
def access(request, force):
    force("elementwise", request.param)
    return request.param


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].astype(np.float32), want[~nan].astype(np.float32))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("n", SIZES)
def test_cast_round_trips_bit_exactly(dtype, n, access):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    x[: min(n, 6)] = np.array([np.nan, np.inf, -np.inf, 7e4, -0.0, 1.00048828125], np.float32)[: min(n, 6)]
    with np.errstate(over="ignore"):
        half = ops.cast(rt.from_numpy(x), dtype).numpy()
        _same(half, reference_cast(x, dtype))
    back = ops.cast(rt.from_numpy(half), "f32").numpy()
    _same(back, half.astype(np.float32))
    other = "fp16" if dtype == "bf16" else "bf16"
    with np.errstate(over="ignore"):
        _same(ops.cast(rt.from_numpy(half), other).numpy(), reference_cast(half, other))
    _same(ops.cast(rt.from_numpy(half), np.dtype(NUMPY[dtype])).numpy(), half)  # same dtype: a copy


@pytest.mark.parametrize("dtype", ["f32", "bf16", "fp16"])
@pytest.mark.parametrize("n", SIZES)
def test_scale_by_keeps_the_scalar_in_fp32(dtype, n, access):
    rng = np.random.default_rng(n + 1)
    x = (rng.standard_normal(n) * 1e-3).astype(NUMPY[dtype])
    s = np.array([1.0 / 3.0], np.float32)  # not a bf16 value: rounding it would show
    got = ops.scale_by(rt.from_numpy(x), rt.from_numpy(s)).numpy()
    _same(got, (x.astype(np.float32) * s[0]).astype(NUMPY[dtype]))


def test_bad_arguments_are_clear_errors():
    x = rt.from_numpy(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="dtype must be one of"):
        ops.cast(x, "int8")
    with pytest.raises(TypeError, match="float32 tensor of one element"):
        ops.scale_by(x, rt.from_numpy(np.ones(2, np.float32)))
    with pytest.raises(TypeError, match="expected a float32, bfloat16 or float16"):
        ops.cast(rt.from_numpy(np.ones(4, np.int32)), "bf16")


@pytest.mark.parametrize("kernel,variant", spirv_cases([CAST_TO_HALF, CAST_TO_F32, SCALE_BY]))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)
