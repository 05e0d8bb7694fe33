"""swiglu beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs swiglu, dropout and
residual_dropout_add forward and backward in every dtype and access): no NaN at extreme gates.
"""

from __future__ import annotations

import numpy as np

import helios.runtime as rt
from helios.kernels import fused as F


def test_swiglu_extremes_no_nan():
    gate = np.array([-1e30, -200, -50, 0, 50, 200, 1e30], np.float32)
    up = np.ones_like(gate)
    y = F.swiglu(rt.from_numpy(gate), rt.from_numpy(up)).numpy()
    assert not np.isnan(y).any()
    dgate, _ = F.swiglu_backward(rt.from_numpy(gate), rt.from_numpy(up), rt.from_numpy(up))
    assert not np.isnan(dgate.numpy()).any()
