"""swiglu beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs swiglu, dropout and
residual_dropout_add forward and backward in every dtype and access): extreme gates, against float64.
"""

from __future__ import annotations

import numpy as np

import helios.runtime as rt
from helios.kernels.pointwise import fused as F


def test_swiglu_extremes_match_float64():
    """Gates where exp over- or underflows: no NaN, and each value within f32 rounding of the float64 reference
    (an absolute 1e-37, under f32's smallest normal, takes silu(-200) ~ -2.8e-85 flushed to zero)."""
    gate = np.array([-1e30, -200, -50, 0, 50, 200, 1e30], np.float32)
    up, dy = np.full_like(gate, 1.5), np.full_like(gate, -0.75)
    y = F.swiglu(rt.from_numpy(gate), rt.from_numpy(up)).numpy()
    dgate, dup = F.swiglu_backward(rt.from_numpy(gate), rt.from_numpy(up), rt.from_numpy(dy))
    with np.errstate(over="ignore"):  # exp(1e30) is inf in the reference too, and sigmoid then exactly 0 or 1
        want = F.reference_swiglu(gate.astype(np.float64), up.astype(np.float64))
        want_dgate, want_dup = F.reference_swiglu_backward(*(a.astype(np.float64) for a in (gate, up, dy)))
    for name, got, ref in (("y", y, want), ("dgate", dgate.numpy(), want_dgate), ("dup", dup.numpy(), want_dup)):
        assert not np.isnan(got).any(), name
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-37, err_msg=name)
