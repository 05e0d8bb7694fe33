"""LayerNorm and RMSNorm beyond their op specs' derived tests (tests/kernels/test_opspecs.py: every layout, width
and dtype at awkward shapes, LayerNorm with and without a bias, gradients added into f32 sinks, finite
differences, spirv-val): a big register tier, more rows than backward workers with gradients accumulated into
views of one parameter arena, and the references against PyTorch.

Tolerances: y within 1e-5 * (1 + |y|); dx within 1e-5 of max |dx|; dw/db (sums over up to 513 rows)
within 1e-4 of max |dw|. Inputs have a mean far from 0 (x ~ 8 + 3 N(0, 1)) so that a one-pass
sum/sum-of-squares variance would fail them.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.rows import norms as N
from tests.conftest import aligned
from tests.kernels.rows.row_variants import force_variant

EPS = 1e-5


def _data(rows, cols, seed=0):
    rng = np.random.default_rng(seed + 7919 * rows + cols)
    x = (rng.standard_normal((rows, cols)) * 3 + 8).astype(np.float32)
    w = (rng.standard_normal(cols) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    return x, w, b, dy


def _close(got, want, rel):
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * max(1.0, float(np.abs(want).max())))


F = rt.from_numpy


@pytest.mark.parametrize("cols", [512])
def test_register_tier_16(cols, force):
    """A big cached tier (slow to compile on lavapipe, so one shape): both norms, forward and backward."""
    force_variant(force, "sg", "u64x2", 16, runs=(N.LAYERNORM, N.LAYERNORM_BACKWARD, N.RMSNORM, N.RMSNORM_BACKWARD))
    x, w, b, dy = _data(20, cols)
    x64 = x.astype(np.float64)
    y, mean, rstd = N.layernorm(F(x), F(w), F(b), EPS)
    ry, rmean, rrstd = N.reference_layernorm(x64, w, b, EPS)
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    dx, dw, db = N.layernorm_backward(F(x), F(w), mean, rstd, F(dy))
    for got, want in zip((dx, dw, db), N.reference_layernorm_backward(x64, w, rmean, rrstd, dy), strict=True):
        _close(got.numpy(), want, 1e-4)
    y, rstd = N.rmsnorm(F(x), F(w), EPS)
    ry, rrstd = N.reference_rmsnorm(x64, w, EPS)
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    dx, dw = N.rmsnorm_backward(F(x), F(w), rstd, F(dy))
    for got, want in zip((dx, dw), N.reference_rmsnorm_backward(x64, w, rrstd, dy), strict=True):
        _close(got.numpy(), want, 1e-4)


# The backward's worker count per workgroup follows the subgroup size: CI runs a streaming and a many-rows shape
# again at sizes 4 and 16 (`-m subgroup`).
SUBGROUP = pytest.mark.subgroup("layernorm", "layernorm_backward", "rmsnorm", "rmsnorm_backward")


@pytest.mark.parametrize("shape", [(513, 36), pytest.param((300, 4097), marks=SUBGROUP), (4, 5, 33),
                                   pytest.param((1000, 64), marks=SUBGROUP)])
def test_many_rows_and_accumulate_into_arena(shape):
    """More rows than backward workers; dw/db added into views of one flat gradient arena."""
    cols = shape[-1]
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 2 - 5).astype(np.float32)
    w, b = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    x64 = x.astype(np.float64)
    pad = aligned(cols)  # views start where the device allows
    start = rng.standard_normal(3 * pad).astype(np.float32)
    arena = F(start)
    dw_out, db_out, dg_out = arena.view(0, (cols,)), arena.view(pad, (cols,)), arena.view(2 * pad, (cols,))
    y, mean, rstd = N.layernorm(F(x), F(w), F(b), EPS)
    ry, rmean, rrstd = N.reference_layernorm(x64, w, b, EPS)
    np.testing.assert_allclose(y.numpy(), ry, rtol=1e-5, atol=1e-5)
    dx, dw, db = N.layernorm_backward(F(x), F(w), mean, rstd, F(dy), dw_out=dw_out, db_out=db_out, accumulate=True)
    rdx, rdw, rdb = N.reference_layernorm_backward(x64, w, rmean, rrstd, dy)
    assert dw is dw_out and db is db_out
    _close(dx.numpy(), rdx, 1e-5)
    yr, rstd_r = N.rmsnorm(F(x), F(w), EPS)
    dxr, dg = N.rmsnorm_backward(F(x), F(w), rstd_r, F(dy), dw_out=dg_out, accumulate=True)
    ryr, rrstd_r = N.reference_rmsnorm(x64, w, EPS)
    rdxr, rdg = N.reference_rmsnorm_backward(x64, w, rrstd_r, dy)
    _close(dxr.numpy(), rdxr, 1e-5)
    got = arena.numpy()
    _close(got[:cols] - start[:cols], rdw, 1e-4)
    _close(got[pad:pad + cols] - start[pad:pad + cols], rdb, 1e-4)
    _close(got[2 * pad:2 * pad + cols] - start[2 * pad:2 * pad + cols], rdg, 1e-4)


def test_references_match_torch():
    """The specs' float64 references (which the derived tests hold every kernel variant to) against torch autograd,
    LayerNorm with and without a bias and RMSNorm, at two eps."""
    import torch
    x, w, b, dy = (a.astype(np.float64) for a in _data(33, 65, seed=5))
    for eps in (EPS, 0.5):
        for bias in (b, None):
            xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
            bt = None if bias is None else torch.tensor(bias, requires_grad=True)
            yt = torch.nn.functional.layer_norm(xt, (65,), wt, bt, eps)
            yt.backward(torch.tensor(dy))
            y, mean, rstd = N.reference_layernorm(x, w, bias, eps)
            np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
            dx, dw, db = N.reference_layernorm_backward(x, w, mean, rstd, dy)
            for got, want in ((dx, xt.grad), (dw, wt.grad)) + (() if bt is None else ((db, bt.grad),)):
                np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)
        xt, wt = (torch.tensor(a, requires_grad=True) for a in (x, w))
        yt = xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + eps) * wt  # RMSNorm by hand
        yt.backward(torch.tensor(dy))
        y, rstd = N.reference_rmsnorm(x, w, eps)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
        for got, want in zip(N.reference_rmsnorm_backward(x, w, rstd, dy), (xt.grad, wt.grad), strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)
