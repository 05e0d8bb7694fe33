"""Fused ops beyond their op specs' derived tests (tests/kernels/test_opspecs.py runs swiglu forward and backward
in every dtype and access): swiglu at extreme gates (no NaN), and residual_dropout_add against the bit-exact numpy
mask, in every access.
"""

from __future__ import annotations

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import dropout as D
from helios.kernels import fused as F

SHAPES = [(1,), (7,), (33, 65), (1, 4097), (513, 3), (33, 64)]


@pytest.mark.parametrize("kernel,variant", [(k, v) for k in (F.RESIDUAL_DROPOUT_ADD,)
                                            for v in k.variants], ids=lambda x: getattr(x, "name", x))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


def _randn(shape, seed):
    return (np.random.default_rng(seed).standard_normal(shape) * 2.5).astype(np.float32)


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
