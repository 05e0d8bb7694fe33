"""bfloat16 and float16 row kernels beyond the op specs' derived tests (tests/kernels/test_opspecs.py runs
LayerNorm, RMSNorm and softmax in every dtype, layout, width and register tier, and RoPE in every dtype and width;
tests/kernels/pointwise/test_rope.py runs RoPE in place; the reductions, sum_rows and sumsq are specs too, and
tests/kernels/rows/test_reduce.py adds half bias gradients into an f32 arena): norm gradients added into an f32 arena,
masked softmax rows: the "bf16_*" and "fp16_*" variants against float64 numpy references of the same
half-rounded inputs; and the mixing-dtypes errors.

Tolerances. A half output is the f32 result rounded once: within ROUNDING[dtype] of it, relative; we allow
2 * ROUNDING relative plus an absolute term for the f32 arithmetic before the rounding (the f32 tests'
bound, ~1e-5 of the row's scale; it matters where an output cancels to near zero). f32 outputs (statistics,
dw/db, sums) see exact half inputs and only f32 arithmetic: the f32 tests' tolerances. Each test runs for
both half dtypes (the `half` fixture); spirv-val of the half variants is in the families' own tests (the op
spec tests for softmax and the norms), which iterate every variant.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.contract.dtypes import NUMPY, ROUNDING
from helios.kernels.lib import row_workers as RW
from helios.kernels.pointwise import rope as P
from helios.kernels.rows import norms as N
from helios.kernels.rows import reduce as R
from helios.kernels.rows import softmax as S
from tests.conftest import aligned, dtype_params
from tests.kernels.rows.row_variants import force_variant

EPS = 1e-5
F = rt.from_numpy


@pytest.fixture(params=dtype_params("bf16", "fp16"))
def half(request):
    return request.param


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """a rounded to the half dtype (what the kernel is given)."""
    return np.asarray(a, np.float32).astype(NUMPY[dtype])


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _scale(want) -> float:
    """The f32 arithmetic's absolute error bound before rounding: 1e-5 of the values' scale (as test_norms)."""
    return 1e-5 * max(1.0, float(np.abs(want).max()))


def _half_close(got, want, dtype: str, atol: float) -> None:
    """A half output: one rounding of an f32 result (see the module doc)."""
    assert got.dtype == NUMPY[dtype], got.dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 * ROUNDING[dtype], atol=atol)


def _f32_close(got, want, rel: float) -> None:
    assert got.dtype == np.float32, got.dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("shape", [(513, 36), (300, 4100), (4, 5, 33)])
def test_norm_grads_accumulate_into_f32_arena(shape, half):
    """Half activations, f32 dw/db added into views of one flat fp32 gradient arena (the training layout)."""
    cols = shape[-1]
    rng = np.random.default_rng(2)
    x = _rounded(rng.standard_normal(shape) * 2 - 5, half)
    w, b = _rounded(rng.standard_normal(cols), half), _rounded(rng.standard_normal(cols), half)
    dy = _rounded(rng.standard_normal(shape), half)
    x64, w64, dy64 = _wide(x), _wide(w), _wide(dy)
    pad = aligned(cols)  # views start where the device allows
    start = rng.standard_normal(3 * pad).astype(np.float32)
    arena = F(start)
    dw_out, db_out, dg_out = arena.view(0, (cols,)), arena.view(pad, (cols,)), arena.view(2 * pad, (cols,))
    _, mean, rstd = N.layernorm(F(x), F(w), F(b), EPS)
    _, rmean, rrstd = N.reference_layernorm(x64, w64, _wide(b), EPS)
    dx, dw, db = N.layernorm_backward(F(x), F(w), mean, rstd, F(dy), dw_out=dw_out, db_out=db_out, accumulate=True)
    rdx, rdw, rdb = N.reference_layernorm_backward(x64, w64, rmean, rrstd, dy64)
    assert dw is dw_out and db is db_out
    _half_close(dx.numpy(), rdx, half, _scale(rdx))
    _, rstd_r = N.rmsnorm(F(x), F(w), EPS)
    N.rmsnorm_backward(F(x), F(w), rstd_r, F(dy), dw_out=dg_out, accumulate=True)
    _, rrstd_r = N.reference_rmsnorm(x64, w64, EPS)
    _, rdg = N.reference_rmsnorm_backward(x64, w64, rrstd_r, dy64)
    got = arena.numpy()
    _f32_close(got[:cols] - start[:cols], rdw, 1e-4)
    _f32_close(got[pad:pad + cols] - start[pad:pad + cols], rdb, 1e-4)
    _f32_close(got[2 * pad:2 * pad + cols] - start[2 * pad:2 * pad + cols], rdg, 1e-4)


def test_softmax_masked_rows(half):
    """-inf (masked) entries give 0, in half storage too (bf16 and fp16 both hold -inf)."""
    x = np.random.default_rng(3).standard_normal((7, 33)).astype(np.float32)
    x[:, 5:] = -np.inf
    y = S.softmax(F(_rounded(x, half))).numpy().astype(np.float64)
    assert np.all(y[:, 5:] == 0)
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=0, atol=5 * ROUNDING[half])


@pytest.mark.needs(dtype="bf16")
def test_mixing_dtypes_is_an_error_naming_the_tensors():
    x = F(np.ones((3, 8), NUMPY["bf16"]))
    w32, w16 = F(np.ones(8, np.float32)), F(np.ones(8, NUMPY["bf16"]))
    with pytest.raises(TypeError, match=r"layernorm: x is bf16, w is f32.*helios.ops.cast"):
        N.layernorm(x, w32, None)
    y, mean, rstd = N.layernorm(x, w16, None)
    with pytest.raises(TypeError, match=r"layernorm_backward: rstd is bfloat16.*must be float32"):
        N.layernorm_backward(x, w16, mean, F(np.ones(3, NUMPY["bf16"])), x)
    with pytest.raises(TypeError, match=r"out is bfloat16.*must be float32"):
        N.layernorm_backward(x, w16, mean, rstd, x, dw_out=F(np.zeros(8, NUMPY["bf16"])))
    with pytest.raises(TypeError, match=r"softmax_backward: y is bf16, dy is fp16"):
        S.softmax_backward(y, F(np.ones((3, 8), np.float16)))
    with pytest.raises(TypeError, match=r"sum_rows: out is bfloat16"):
        R.sum_rows(x, out=F(np.zeros(8, NUMPY["bf16"])))
    with pytest.raises(TypeError, match=r"rope: qkv is bf16, out is f32"):
        P.rope(F(np.ones((1, 2, 12), NUMPY["bf16"])), 1, 1, 4, 500.0, out=F(np.ones((1, 2, 12), np.float32)))


def test_half_variants_are_chosen(force):
    """The op functions pick the variant of their tensors' dtype (same base name as f32)."""
    force_variant(force, "sg", "u64x2", 4)
    assert RW.choose(7, 516, dtype="bf16") == "bf16_" + RW.choose(7, 516)
    assert RW.choose(7, 33, dtype="fp16") == "fp16_" + RW.choose(7, 33)
