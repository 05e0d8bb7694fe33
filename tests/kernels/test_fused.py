"""Fused ops: swiglu forward/backward against PyTorch autograd, residual_dropout_add forward/backward against the
bit-exact numpy mask, in the scalar and vec4 variants.

Tolerance 1e-5 relative (2e-5 for gradients): each output is a handful of f32 operations around one exp.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios.kernels import dropout as D
from helios.kernels import fused as F

SHAPES = [(1,), (7,), (33, 65), (1, 4097), (513, 3), (33, 64)]


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in (F.SWIGLU, F.SWIGLU_BWD, F.RESIDUAL_DROPOUT_ADD)
                                            for v in k.variants], ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _randn(shape, seed):
    return (np.random.default_rng(seed).standard_normal(shape) * 2.5).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu_against_torch(shape, access):
    gate, up, dy = _randn(shape, 1), _randn(shape, 2), _randn(shape, 3)
    g, u = (torch.from_numpy(a.astype(np.float64)).requires_grad_(True) for a in (gate, up))
    y = torch.nn.functional.silu(g) * u
    y.backward(torch.from_numpy(dy.astype(np.float64)))
    gt, ut = rt.from_numpy(gate), rt.from_numpy(up)
    np.testing.assert_allclose(F.swiglu(gt, ut).numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    dgate, dup = F.swiglu_backward(gt, ut, rt.from_numpy(dy))
    assert dgate.shape == shape and dup.shape == shape
    np.testing.assert_allclose(dgate.numpy(), g.grad.numpy(), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(dup.numpy(), u.grad.numpy(), rtol=2e-5, atol=1e-6)


def test_swiglu_reference_gradient_by_finite_differences():
    gate, up, dy = (np.random.default_rng(s).standard_normal(50) for s in (4, 5, 6))
    h = 1e-6
    dgate, dup = F.reference_swiglu_backward(gate, up, dy)
    fd_gate = (F.reference_swiglu(gate + h, up) - F.reference_swiglu(gate - h, up)) / (2 * h) * dy
    fd_up = (F.reference_swiglu(gate, up + h) - F.reference_swiglu(gate, up - h)) / (2 * h) * dy
    np.testing.assert_allclose(dgate, fd_gate, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(dup, fd_up, rtol=1e-6, atol=1e-9)


def test_swiglu_extremes_no_nan():
    gate = np.array([-1e30, -200, -50, 0, 50, 200, 1e30], np.float32)
    up = np.ones_like(gate)
    y = F.swiglu(rt.from_numpy(gate), rt.from_numpy(up)).numpy()
    assert not np.isnan(y).any()
    dgate, _ = F.swiglu_backward(rt.from_numpy(gate), rt.from_numpy(up), rt.from_numpy(up))
    assert not np.isnan(dgate.numpy()).any()


@pytest.mark.parametrize("shape", [(7,), (33, 65), (1, 4097), (9, 32)])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_residual_dropout_add(shape, p, access):
    x, y, dout = _randn(shape, 7), _randn(shape, 8), _randn(shape, 9)
    seed, offset = 1234, 17
    out = F.residual_dropout_add(rt.from_numpy(x), rt.from_numpy(y), p, seed, offset)
    want = x + D.reference_dropout(y, p, seed, offset)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)
    dy = F.residual_dropout_add_backward(rt.from_numpy(dout), p, seed, offset).numpy()
    np.testing.assert_array_equal(dy, D.reference_dropout(dout, p, seed, offset))
    if 0 < p < 1:  # backward drops exactly what forward dropped
        np.testing.assert_array_equal(dy == 0, out.numpy() == x)
