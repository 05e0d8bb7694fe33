"""The norm backwards' folded add (`dx_add=`: dx + dx_add from the row kernel, autograd's pending gradient for x)
beyond the op spec tests' random case (tests/kernels/test_opspecs.py): at every forced row variant and dtype, over
rows 1, 7, 33, 513 x cols 7, 33, 128, 516 (scalar and 4-wide rows, register tiers and streaming), with edge values,
the result is bit for bit what ops.add(dx_add, dx) gives after the unfused kernel: rows whose dy is 0 (dx = +0)
meeting dx_add = -0.0, dx_add = -dx (sums of exactly 0), tiny and huge dx_add, and a bare rmsnorm/layernorm
without a bias. Exact, not a tolerance: f32 addition commutes, and a half dx is rounded to its dtype before the
add, as a stored dx would be.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios import ops
from helios.kernels.contract.dtypes import NUMPY
from helios.kernels.rows import norms as N
from tests.kernels.rows.row_variants import force_variant, norm_backward_cases

F = rt.from_numpy
SHAPES = [(r, c) for r in (1, 7, 33, 513) for c in (7, 33, 128, 516)]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.itemsize == 2 else np.uint32)


def _data(rng, rows: int, cols: int, dtype: str):
    x = (rng.standard_normal((rows, cols)) * 3 + 8).astype(NUMPY[dtype])
    w = (rng.standard_normal(cols) * 0.5 + 1).astype(NUMPY[dtype])
    b = rng.standard_normal(cols).astype(NUMPY[dtype])
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    dy[0] = 0.0  # the first row's dx is +0 everywhere
    return x, w, b, dy.astype(NUMPY[dtype])


def _addend(rng, dx: np.ndarray) -> np.ndarray:
    """A dx_add of dx's shape and dtype: random, with -0.0, -dx, tiny and huge values at fixed strides."""
    add = rng.standard_normal(dx.shape).astype(np.float32)
    flat, own = add.reshape(-1), dx.astype(np.float32).reshape(-1)
    flat[0::5] = -0.0
    flat[1::5] = -own[1::5]
    flat[2::7] = 1e-30
    flat[3::11] = 3e4 if dx.dtype.itemsize == 2 else 1e30
    return add.astype(dx.dtype)


def _same(got, unfused, dx_add, what: str) -> None:
    want = ops.add(F(dx_add), unfused).numpy()
    got = got.numpy()
    assert got.dtype == want.dtype, f"{what}: {got.dtype}, expected {want.dtype}"
    bad = np.flatnonzero(_bits(got).reshape(-1) != _bits(want).reshape(-1))
    assert not bad.size, f"{what}: {bad.size} elements differ from a separate add, first at {bad[0]}: " \
        f"{got.reshape(-1)[bad[0]]!r} vs {want.reshape(-1)[bad[0]]!r}"


@pytest.mark.parametrize("choice,dtype", norm_backward_cases())
def test_folded_add_is_bit_identical(choice, dtype, force):
    force_variant(force, *choice, runs=(N.LAYERNORM_BACKWARD, N.RMSNORM_BACKWARD))
    rng = np.random.default_rng(11)
    for rows, cols in SHAPES:
        x, w, b, dy = (F(a) for a in _data(rng, rows, cols, dtype))
        for bias in (b, None):
            _, mean, rstd = N.layernorm(x, w, bias)
            has_bias = bias is not None
            dx, _, _ = N.layernorm_backward(x, w, mean, rstd, dy, has_bias=has_bias)
            add = _addend(rng, dx.numpy())
            folded, _, _ = N.layernorm_backward(x, w, mean, rstd, dy, has_bias=has_bias, dx_add=F(add))
            _same(folded, dx, add, f"layernorm{'' if has_bias else ' (no bias)'} {rows}x{cols}")
        _, rstd = N.rmsnorm(x, w)
        dx, _ = N.rmsnorm_backward(x, w, rstd, dy)
        add = _addend(rng, dx.numpy())
        folded, _ = N.rmsnorm_backward(x, w, rstd, dy, dx_add=F(add))
        _same(folded, dx, add, f"rmsnorm {rows}x{cols}")


def _rms_case():
    x, w, _, dy = (F(a) for a in _data(np.random.default_rng(0), 4, 8, "f32"))
    _, rstd = N.rmsnorm(x, w)
    return x, w, rstd, dy


def test_dx_add_of_another_shape_is_refused():
    x, w, rstd, dy = _rms_case()
    with pytest.raises(ValueError, match="dx_add"):
        N.rmsnorm_backward(x, w, rstd, dy, dx_add=F(np.zeros((8, 4), np.float32)))  # as many elements, not x's shape


@pytest.mark.needs(dtype="fp16")
def test_dx_add_of_another_dtype_is_refused():
    x, w, rstd, dy = _rms_case()
    with pytest.raises(TypeError, match="dx_add"):
        N.rmsnorm_backward(x, w, rstd, dy, dx_add=F(np.zeros((4, 8), np.float16)))
